"""The answer a team acts on (issue 109): the lead estimator chosen from the evaluation's own
data, paired differences with intervals of the same kind as the estimates', the verdict per
pair of systems and ranks from the same intervals, PPI on a difference that covers."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from recjudge.evaluators import GoldSample, RecRun, RunCheck, listed_pairs
from recjudge.evaluators.offline._estimators import Estimate, ListLabels, estimate
from recjudge.evaluators.offline._evaluate import report_lines
from recjudge.evaluators.offline._evaluation import (
    _flag_out_of_range,
    estimate_evaluation,
    paired_difference,
)
from recjudge.evaluators.offline._gold_ppi import ppi_difference
from recjudge.evaluators.offline._jobs import _imputer_worse
from recjudge.evaluators.offline._propensities import logged_propensities
from recjudge.evaluators.offline._verdict import (
    Advice,
    choose_lead,
    verdict_frame,
    verdict_lines,
    verdict_table,
)
from recjudge.reporting._mlflow import report_metrics, report_tags
from synthetic_world import gold, world


def _world(seed: int, n_users: int = 300):
    """``synthetic_world.world`` with more relevant pairs (logit base -2.0)."""
    return world(seed, n_users=n_users, base=-2.0)


_gold = gold


@pytest.mark.parametrize("design", ["uniform", "users"])
def test_ppi_difference_covers_the_true_difference(design):
    reps, hits, widths = 60, 0, []
    for rep in range(reps):
        runs, users, rel, judged, truth = _world(100 + rep)
        gold = _gold(runs, users, rel, 300, design, rep)
        frame = len(listed_pairs(runs, users, 10))
        d = ppi_difference(runs[2], runs[0], users, judged, gold, "precision@10", frame)
        lo, hi = d["ci"]
        assert lo <= d["value"] <= hi
        hits += lo <= truth["s2"] - truth["s0"] <= hi
        widths.append(hi - lo)
    # 95 % nominal; 60 reps: a correct interval falls below 0.85 with probability < 1e-3
    assert hits / reps >= 0.85
    assert np.mean(widths) < 0.3  # informative on a precision difference of ~0.08


def test_ppi_difference_refuses_a_partly_labelled_user_of_the_users_design():
    runs, users, rel, judged, _ = _world(3)
    gold = _gold(runs, users, rel, 100, "users", 0)
    u = next(iter(gold.labels))[0]
    cut = {key: v for key, v in gold.labels.items() if key != next(
        key for key in gold.labels if key[0] == u)}  # fmt: skip
    partial = GoldSample(cut, design="users")
    with pytest.raises(ValueError, match="without a gold label"):
        ppi_difference(runs[0], runs[1], users, judged, partial, "precision@10", 1)


def _lists(values: list[list[float]]) -> dict[str, ListLabels]:
    out = {}
    for u, y in enumerate(values):
        y = np.asarray(y, dtype=float)
        ones = np.ones(len(y))
        out[str(u)] = ListLabels(ones, y, y, y, ones)
    return out


def test_paired_difference_uses_the_shared_resamples():
    g = np.random.default_rng(0)
    base = g.random((80, 5)) < 0.3
    a = _lists(base.astype(float).tolist())
    b = _lists(np.where(g.random((80, 5)) < 0.04, 1.0, base).tolist())  # b >= a on every user
    ea = estimate(a, ["precision@5"], ["logged"])["precision@5"]["logged"]
    eb = estimate(b, ["precision@5"], ["logged"])["precision@5"]["logged"]
    d = paired_difference(eb, ea)
    assert d["value"] == pytest.approx(eb.value - ea.value)
    # paired: b beats a on every user it differs on, so every resample's difference is >= 0
    assert d["ci"][0] >= 0 and d["ci"][1] > 0
    # an unpaired interval from the two marginal intervals would hold 0 here
    assert eb.ci[0] < ea.ci[1]
    none = Estimate("dm", "precision@5", None, None)
    assert paired_difference(none, ea) == {"value": None, "ci": None}


def test_oua_difference_takes_the_t_interval_of_its_estimates():
    draws = np.linspace(0.1, 0.3, 50)
    a = Estimate("dm", "precision@5", 0.2, (0.1, 0.3), boot=draws, t_quantile=2.0)
    b = Estimate("dm", "precision@5", 0.1, (0.0, 0.2), boot=draws * 0.5, t_quantile=2.0)
    d = paired_difference(a, b)
    half = 2.0 * float(np.std(draws * 0.5, ddof=1))
    assert d["ci"] == pytest.approx([0.1 - half, 0.1 + half])


def _got(values: dict[str, dict[str, float | None]], weights="stable", gold="none"):
    systems = {s: {"precision@10": {e: {"value": v} for e, v in by.items()}}
               for s, by in values.items()}  # fmt: skip
    return {"systems": systems, "gold": gold,
            "weights": {s: {"verdict": weights} for s in values}}  # fmt: skip


def test_lead_rule_reads_the_evaluations_own_data():
    est = {"logged": 0.1, "imputed": 0.2, "dm": 0.2, "ips": 0.1, "snips": 0.1, "dr": 0.15}
    wanted = list(est)
    both = {"a": dict(est), "b": dict(est)}
    lead = choose_lead(_got(both), wanted, "precision@10", False, "fit")
    assert (lead["estimator"], lead["guarantee"]) == ("snips", True)
    assert choose_lead(_got(both), wanted, "precision@10", True, "fit")["estimator"] == "dr"
    fragile = choose_lead(_got(both, "fragile"), wanted, "precision@10", False, "fit")
    assert (fragile["estimator"], fragile["guarantee"]) == ("imputed", False)
    assert "fragile" in fragile["why"] and "WITHOUT GUARANTEE" in fragile["why"]
    assumed = choose_lead(_got(both), wanted, "precision@10", True, "powerlaw:0.5")
    assert (assumed["estimator"], assumed["guarantee"]) == ("dm", False)
    with_ppi = {s: {**d, "ppi": 0.12} for s, d in both.items()}
    lead = choose_lead(_got(with_ppi, gold="g.csv"), wanted, "precision@10", False, "fit")
    assert lead["estimator"] == "ppi"
    undefined = {"a": {**est, "ppi": 0.1}, "b": {**est, "ppi": None}}
    lead = choose_lead(_got(undefined, gold="g.csv"), wanted, "precision@10", False, "fit")
    assert lead["estimator"] == "snips" and "PPI is undefined" in lead["why"]
    every = {s: {**d, "ppi": None, "labels": 0.11} for s, d in both.items()}
    assert choose_lead(_got(every, gold="g.csv"), wanted, "precision@10", False,
                       "fit")["estimator"] == "labels"  # fmt: skip


def test_nothing_under_src_reads_reports_or_the_working_folder():
    """No path built from ``reports`` (``x / "reports"``), no glob for a results.json, and no
    ``Path.cwd()`` outside the command line (which only keeps outputs inside it)."""
    src = Path(__file__).resolve().parents[2] / "src" / "recjudge"
    offenders = []
    for path in src.rglob("*.py"):
        rel = path.relative_to(src)
        if rel.parts[0] == "bench":  # the benchmarks write reports; nothing reads them back
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.BinOp)
                and isinstance(node.op, ast.Div)
                and isinstance(node.right, ast.Constant)
                and node.right.value == "reports"
            ):
                offenders.append(f"{rel}: / 'reports'")  # fmt: skip
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                texts = [a.value for a in node.args if isinstance(a, ast.Constant)]
                if node.func.attr in ("glob", "rglob") and any(
                        "results.json" in str(t) for t in texts):  # fmt: skip
                    offenders.append(f"{rel}: glob results.json")
                if node.func.attr == "cwd" and rel.parts[0] != "cli":
                    offenders.append(f"{rel}: Path.cwd()")
    assert not offenders, offenders


def _table(diffs, names=("a", "b", "c"), lead="snips", guarantee=True):
    runs = [RecRun(n, "", {"u": ["i"]}, {}, RunCheck()) for n in names]
    leads = {"precision@10": {"estimator": lead, "metric": "precision@10",
                              "guarantee": guarantee, "why": "test"}}  # fmt: skip
    differences = {"precision@10": {lead: diffs}}
    users = [str(u) for u in range(50)]
    return verdict_table(differences, leads, runs, users, {}, Advice("R", "Q", 10))


def test_verdict_follows_the_interval_and_ranks_follow_the_verdicts():
    v = _table(
        {
            "a - b": {"value": 0.05, "ci": [0.01, 0.09]},
            "a - c": {"value": -0.02, "ci": [-0.03, -0.01]},
            "b - c": {"value": -0.07, "ci": [-0.15, 0.01]},
        }
    )["precision@10"]
    rows = {(r["a"], r["b"]): r for r in v["rows"]}
    assert rows[("a", "b")]["better"] == "a"
    assert rows[("a", "b")]["text"].startswith("a better than b by 0.0500 [0.0100, 0.0900]")
    assert rows[("a", "c")]["better"] == "c"
    assert rows[("a", "c")]["text"].startswith("c better than a by 0.0200 [0.0100, 0.0300]")
    tie = rows[("b", "c")]
    assert tie["better"] is None and "not separable at this size" in tie["text"]
    assert tie["advice"]["text"]  # says what would separate them
    # c > a > b by points; c surely beats a, a surely beats b; b vs c not separable
    assert v["ranks"]["c"] == {"rank": 1, "rank_ci": [1, 2]}
    assert v["ranks"]["a"] == {"rank": 2, "rank_ci": [2, 2]}
    assert v["ranks"]["b"] == {"rank": 3, "rank_ci": [2, 3]}
    lines = "\n".join(verdict_lines({"precision@10": v}))
    assert lines.index("## Verdict") < lines.index("a better than b")
    frame = verdict_frame({"verdicts": {"precision@10": v}})
    assert list(frame["better"][:2]) == ["a", "c"] and frame["better"].isna().tolist()[2]
    assert frame["ci_low"].tolist()[:2] == [0.01, -0.03]


def test_not_separable_advice_scales_with_the_gold_sample_under_ppi():
    runs = [RecRun(n, "", {str(u): [f"i{u}-{j}" for j in range(10)] for u in range(100)}, {},
                   RunCheck()) for n in ("a", "b")]  # fmt: skip
    leads = {"precision@10": {"estimator": "ppi", "metric": "precision@10",
                              "guarantee": True, "why": "gold"}}  # fmt: skip
    diffs = {"precision@10": {"ppi": {"a - b": {"value": 0.02, "ci": [-0.02, 0.06]}}}}
    users = [str(u) for u in range(100)]
    row = verdict_table(diffs, leads, runs, users, {}, Advice("R", "Q", 10, gold_pairs=100))[
        "precision@10"]["rows"][0]  # fmt: skip
    # half-width 0.04 for a difference of 0.02: (0.04 / (0.02 * 1.96 / 2.80))^2 = 8.2x
    assert row["advice"]["pairs"] == pytest.approx(100 * (0.04 / (0.02 * 1.96 / 2.8016)) ** 2,
                                                   abs=1)  # fmt: skip
    assert "--n" in row["advice"]["command"]


def test_every_listed_pair_labelled_gives_the_labels_alone_with_an_interval():
    runs, users, rel, judged, truth = _world(5, n_users=40)
    frame = listed_pairs(runs, users, 10)
    gold = GoldSample({pair: rel[pair] for pair in frame}, design="users")
    logged = {u: {runs[0].rankings[u][0]: rel[(u, runs[0].rankings[u][0])]} for u in users}
    props = logged_propensities(logged, 0.5, 0.01)
    got = estimate_evaluation(runs, logged, judged, props, users, ["precision@10"],
                              ["dm"], gold=gold)  # fmt: skip
    for r in runs:
        e = got["systems"][r.name]["precision@10"]["labels"]
        assert e["value"] == pytest.approx(truth[r.name])  # the metric itself
        assert e["ci"][0] < e["value"] < e["ci"][1] and e["rank_ci"] is not None
    lead = choose_lead(got, ["dm"], "precision@10", False, "fit")
    assert lead["estimator"] == "labels"
    d = got["differences"]["precision@10"]["labels"]["s0 - s2"]
    assert d["value"] == pytest.approx(truth["s0"] - truth["s2"])


def test_an_interval_outside_the_metrics_range_is_flagged_not_only_a_value():
    systems = {"a": {"precision@10": {
        "dr": {"value": 0.4, "ci": [-0.408, 1.711], "note": ""},
        "snips": {"value": 1.3, "ci": [1.1, 1.5], "note": ""},
        "dm": {"value": 0.4, "ci": [0.3, 0.5], "note": ""}}}}  # fmt: skip
    _flag_out_of_range(systems)
    _flag_out_of_range(systems)  # a second call (after the gold estimates) adds nothing
    got = systems["a"]["precision@10"]
    assert got["dr"]["out_of_range"] == "interval" and "reaches outside" in got["dr"]["note"]
    assert got["dr"]["note"].count("unreliable") == 1
    assert got["snips"]["out_of_range"] == "value"
    assert "out_of_range" not in got["dm"] and got["dm"]["note"] == ""


def test_the_paired_differences_print_intervals_without_a_p_value():
    res = {"users": 40, "metrics": ["ndcg@10"], "scores": {"logged": {"a": {"ndcg@10": 0.2},
                                                                     "b": {"ndcg@10": 0.1}}},
           "intervals": {}, "tests": {"logged": {"ndcg@10": {"a vs b": 0.10}}},
           "differences": {"logged": {"ndcg@10": {"a - b": {"value": 0.1,
                                                            "ci": [0.02, 0.18]}}}}}  # fmt: skip
    text = "\n".join(report_lines(res, []))
    assert "a - b 0.1000 [0.0200, 0.1800]" in text and "p=" not in text


def test_mlflow_logs_the_verdict_first():
    v = _table({"a - b": {"value": 0.05, "ci": [0.01, 0.09]},
                "a - c": {"value": -0.02, "ci": [-0.03, -0.01]},
                "b - c": {"value": -0.07, "ci": [-0.15, 0.01]}})  # fmt: skip
    got = report_metrics({"verdicts": v})
    assert list(got)[:3] == ["verdict.precision_10.a - b", "verdict.precision_10.a - b.lo",
                             "verdict.precision_10.a - b.hi"]  # fmt: skip
    assert got["verdict.precision_10.a - c.hi"] == -0.01
    tags = report_tags({"verdicts": v}, "t")
    assert tags["verdict.precision_10"].startswith("snips: a better than b by 0.0500")


def test_an_imputer_worse_than_the_raw_judge_is_said_and_does_not_lead():
    """Issue 111: a supervised imputer whose out-of-fold AUC (0.398) is below the raw
    judge's (0.469) led DM/DR without a word."""
    bad = SimpleNamespace(method="boosting", oof={"auc": 0.398, "auc_raw": 0.469})
    line = _imputer_worse(bad)
    assert "0.398 vs 0.469" in line and "do not lead" in line
    good = SimpleNamespace(method="logistic", oof={"auc": 0.6, "auc_raw": 0.55})
    assert _imputer_worse(good) is None
    assert _imputer_worse(None) is None
    both = {"a": {"snips": 0.1, "dr": 0.2, "dm": 0.2}, "b": {"snips": 0.1, "dr": 0.2, "dm": 0.2}}
    got = _got(both)
    assert choose_lead(got, ["snips", "dr", "dm"], "precision@10", True, "fit")["estimator"] == "dr"
    # evaluate passes calibrated=False to the rule when the imputer is worse
    assert choose_lead(got, ["snips", "dr", "dm"], "precision@10", False,
                       "fit")["estimator"] == "snips"  # fmt: skip
