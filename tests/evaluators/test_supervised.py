"""The supervised imputer: cross-fitted over users (a gold pair's probability never depends
on its own label), it learns from the signals beside the judge, it says what it used, and in
the known-truth world its PPI interval is narrower than labels alone."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from test_offline_estimators import _all, _world

from recjudge._stats import auc
from recjudge.bench._imputer_gold import imputer_summary, imputers_on_gold
from recjudge.bench._offline_estimators import (
    propensity_sets,
    runs_of,
    simulate_log,
    truth_of,
)
from recjudge.data import DataError
from recjudge.evaluators import EvaluateJob, run_evaluate
from recjudge.evaluators.offline._supervised import (
    design_matrix,
    features_of,
    fit_imputer,
    read_feature_rows,
)


def _rows(n_users=40, per_user=10, seed=0):
    """Pairs whose relevance follows sigma and popularity; the judge's p_yes is noise."""
    g = np.random.default_rng(seed)
    rows, truth = {}, {}
    for u in range(n_users):
        for i in range(per_user):
            sigma = float(g.uniform(-1, 1))
            pop = int(g.integers(0, 500))
            logit = 3 * sigma + 0.004 * pop - 1
            y = int(g.random() < 1 / (1 + math.exp(-logit)))
            rec = {
                "item_id": f"i{i}",
                "p_yes": float(g.uniform(0.2, 0.9)),
                "p_yes_semantic": float(g.uniform(0.2, 0.9)),
                "sigma": sigma,
                "history_len": int(g.integers(5, 60)),
                "evidence": ["t"] * int(g.integers(3)),
            }
            rows[(f"u{u}", f"i{i}")] = features_of(rec, {f"i{i}": pop})
            truth[(f"u{u}", f"i{i}")] = y
    return rows, truth


def test_features_are_read_from_an_imputed_record():
    f = features_of({"item_id": "a", "p_yes": 0.8, "p_yes_semantic": 0.5, "sigma": -0.25,
                     "history_len": 9, "evidence": ["x", "y"]}, {"a": 4})  # fmt: skip
    assert f["logit_p_yes"] == pytest.approx(math.log(4))
    assert f["logit_p_semantic"] == pytest.approx(0.0)
    assert f == {**f, "sigma": -0.25, "log_popularity": pytest.approx(math.log(5)),
                 "log_history": pytest.approx(math.log(10)), "evidence": 2.0}  # fmt: skip
    missing = features_of({"item_id": "a", "p_yes": 1.0}, None)
    assert missing["sigma"] is None and missing["log_popularity"] is None
    assert math.isfinite(missing["logit_p_yes"])  # p = 1 is clipped, not infinite


def test_a_feature_missing_somewhere_or_constant_is_left_out_and_named():
    rows = [
        {"logit_p_yes": 0.1, "sigma": None, "log_popularity": 1.0, "evidence": 0.0},
        {"logit_p_yes": 0.3, "sigma": 0.5, "log_popularity": 1.0, "evidence": 1.0},
    ]
    x, used = design_matrix(rows)
    assert used == ["logit_p_yes", "evidence"] and x.shape == (2, 2)


@pytest.mark.parametrize("method", ["logistic", "boosting", "isotonic"])
def test_a_gold_pairs_probability_does_not_depend_on_its_own_label(method):
    rows, truth = _rows()
    gold = {k: v for k, v in truth.items() if int(k[0][1:]) < 20}
    a = fit_imputer(rows, gold, method)
    key = next(iter(gold))
    flipped = {**gold, key: 1 - gold[key]}
    b = fit_imputer(rows, flipped, method)
    assert a.p[key] == pytest.approx(b.p[key], abs=1e-12)  # out of fold: its label unused
    assert all(0.0 <= v <= 1.0 for v in a.p.values()) and len(a.p) == len(rows)
    assert a.gold_pairs == len(gold) and a.gold_users == 20 and a.folds == 5


def test_it_learns_from_the_signals_beside_the_judge():
    rows, truth = _rows(seed=1)
    gold = {k: v for k, v in truth.items() if int(k[0][1:]) < 25}
    fitted = fit_imputer(rows, gold, "logistic")
    assert "sigma" in fitted.features and "log_popularity" in fitted.features
    assert fitted.oof["auc"] > fitted.oof["auc_raw"] + 0.15  # raw p_yes is noise here
    # and on pairs it never saw
    rest = [k for k in truth if k not in gold]
    pos = [fitted.p[k] for k in rest if truth[k]]
    neg = [fitted.p[k] for k in rest if not truth[k]]
    assert auc(pos, neg) > 0.7
    assert "logistic on" in fitted.describe() and "cross-fitted over 5 user folds" in (
        fitted.describe())  # fmt: skip


def test_too_little_or_one_class_gold_is_refused():
    rows, truth = _rows()
    with pytest.raises(ValueError, match="at least 10 pairs of 10 users"):
        fit_imputer(rows, dict(list(truth.items())[:5]))
    nine_users = {k: v for k, v in truth.items() if int(k[0][1:]) < 9}
    with pytest.raises(ValueError, match="90 gold pairs of 9 users.*label more users"):
        fit_imputer(rows, nine_users)
    with pytest.raises(ValueError, match="both classes"):
        fit_imputer(rows, {k: 1 for k in list(truth)[:150]})
    with pytest.raises(ValueError, match="unknown imputer"):
        fit_imputer(rows, truth, "forest")  # type: ignore[arg-type]


def test_a_bad_sidecar_line_names_the_file_and_row(tmp_path):
    good = {"user_id": "u", "item_id": "i", "label": 1, "p_yes": 0.7, "sigma": 0.1}
    path = tmp_path / "imputed.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps({"user_id": "u", "error": "x"})
                    + "\n[1, 2]\n")  # fmt: skip
    with pytest.raises(DataError, match="row 3"):
        read_feature_rows(path, None)
    path.write_text(json.dumps(good) + "\n")
    assert set(read_feature_rows(path, None)) == {("u", "i")}


def test_in_the_known_truth_world_it_narrows_ppi_against_labels_alone():
    """The bench's gold machinery on a synthetic world where the CF signal carries the
    relevance and the judge does not: the supervised imputer's PPI interval is narrower
    than the labels-only one, whose interval the judge's noise cannot narrow."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "bench"))

    w, _ = _world(users=80)
    g = np.random.default_rng(1)
    n = len(w.pairs)
    w.imputers["judge:x"] = (g.uniform(0.3, 0.7, n), np.ones(n))
    w.imputers["cf"] = (np.clip(0.7 * w.relevant + g.uniform(0, 0.3, n), 0, 1), np.ones(n))
    truth = truth_of(w, ["precision@5"])
    logs = []
    for t in range(3):
        observed, logged = simulate_log(w, np.random.default_rng(t))
        thetas, _ = propensity_sets(w, logged, 0.01, 0.5)
        logs.append(
            imputers_on_gold(
                w,
                "judge:x",
                ["precision@5"],
                [60],
                t,
                truth,
                (observed, thetas["fit"], _all(w)["listed"]),
                runs_of(w),
            )
        )
    s = imputer_summary(logs)["60"]["uniform"]
    width = {row: c["precision@5"]["ci_width"] for row, c in s.items() if "precision@5" in c}
    assert s["auc [supervised:logistic]"]["auc"] > 0.9  # sigma carries the relevance here
    assert set(width) >= {
        "ppi [labels-only]",
        "ppi [judge judge:x]",
        "ppi [supervised:logistic]",
        "dr [supervised:logistic, fit theta]",
    }
    assert width["ppi [supervised:logistic]"] < 0.6 * width["ppi [labels-only]"]
    # the transport rows say what the plant did to the level and what the check could see
    tr = s["transport"]
    assert 0 <= tr["planted_true_bias"] < 1 and tr["planted_detectable"] > 0


def _evaluate_folder(tmp, users=40, k=5, seed=0):
    """An impute folder whose unlabelled pairs' relevance follows sigma (p_yes is noise), the
    runs it judged, and a labelled gold file of half the users' listed pairs."""
    g = np.random.default_rng(seed)
    tmp.mkdir(parents=True)
    lists = {name: {f"u{u}": [f"{name}{u}_{r}" for r in range(k)] for u in range(users)}
             for name in ("a", "b")}  # fmt: skip
    logged = {f"u{u}": {f"a{u}_0": 1} for u in range(users)}
    rows, gold, imputed = [], ["user_id,item_id,label"], {u: dict(v) for u, v in logged.items()}
    for name, by_user in lists.items():
        for u, items in by_user.items():
            for i in items:
                sigma = float(g.uniform(-1, 1))
                y = int(g.random() < (0.8 if sigma > 0 else 0.1))
                p = float(g.uniform(0.3, 0.9))
                rows.append({"user_id": u, "item_id": i, "label": int(p > 0.5), "p_yes": p,
                             "p_yes_semantic": p, "sigma": sigma, "history_len": 20,
                             "evidence": []})  # fmt: skip
                imputed[u].setdefault(i, int(p > 0.5))
                if int(u[1:]) % 2 == 0:
                    gold.append(f"{u},{i},{y}")
        (tmp / f"{name}.jsonl").write_text("".join(
            json.dumps({"user_id": u, "item_id": i, "rank": r + 1}) + "\n"
            for u, items in by_user.items() for r, i in enumerate(items)))  # fmt: skip
    (tmp / "qrels_logged.json").write_text(json.dumps(logged))
    (tmp / "qrels_imputed.json").write_text(json.dumps(imputed))
    (tmp / "imputed.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp / "summary.json").write_text(json.dumps({"calibrated": False}))
    (tmp / "gold.csv").write_text("\n".join(gold) + "\n")
    return f"a={tmp / 'a.jsonl'},b={tmp / 'b.jsonl'}"


def test_evaluate_fits_the_imputer_on_the_gold_and_names_it(tmp_path):
    runs = _evaluate_folder(tmp_path / "imp")
    job = dict(runs=runs, qrels=str(tmp_path / "imp"), k=5, metrics="precision@5",
               gold=str(tmp_path / "imp" / "gold.csv"))  # fmt: skip
    res = run_evaluate(EvaluateJob(**job, calibration="logistic", out=str(tmp_path / "rep")),
                       warn=lambda m: None)  # fmt: skip
    est = res["estimators"]
    assert est["imputer"]["method"] == "logistic" and "sigma" in est["imputer"]["features"]
    assert est["imputer"]["gold_users"] == 20 and est["imputer"]["folds"] == 5
    assert est["imputer"]["out_of_fold"]["auc"] > 0.75 > est["imputer"]["out_of_fold"]["auc_raw"]
    assert est["calibration"].startswith("supervised imputer: logistic")
    assert "refits the imputer on resampled gold users" in est["calibration"]
    for system in ("a", "b"):
        ppi = est["systems"][system]["precision@5"]["ppi"]
        assert ppi["value"] is not None and ppi["ci"][0] <= ppi["value"] <= ppi["ci"][1]
    report = (tmp_path / "rep" / "report.md").read_text()
    assert "supervised imputer: logistic" in report
    # each system checked against the imputer refitted on the other's gold pairs, and DM's
    # interval carries the calibration's residual on its own gold pairs
    assert {d["map"] for d in est["transport"].values()} == {"leave-system-out"}
    assert "map fitted without its pairs" in report
    for system in ("a", "b"):
        dm = est["systems"][system]["precision@5"]["dm"]
        if dm["value"] is not None:
            assert "transport-bounded" in dm["note"] and dm["ci"][0] < dm["ci"][1]
    with pytest.raises(ValueError, match="--calibration logistic fits the judge to gold"):
        run_evaluate(EvaluateJob(**{**job, "gold": None}, calibration="logistic"),
                     warn=lambda m: None)  # fmt: skip
