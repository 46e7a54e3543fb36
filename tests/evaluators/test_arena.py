"""RecSys Arena: aggregate arithmetic, the order-swap rule, Bradley-Terry, and a real run."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from cli_in_process import run_cli
from recjudge.evaluators import (
    ASPECT_DEFINITIONS,
    ASPECTS,
    ArenaConfig,
    arena_messages,
    bradley_terry,
    combine_orders,
    correlations,
    ndcg_at,
    order_averaged_preference,
    order_averaged_preference_ci,
    order_flip_by_system,
    order_flip_by_system_ci,
    order_flip_ci,
    order_flip_rate,
    pair_counts,
    pair_records,
    position_shares,
    q_score,
    reference_q,
    reference_q_ci,
    run_arena,
    summarize,
    swap_rule_records,
    system_q,
    urd,
)
from recjudge.evaluators.arena._metrics import OPTIONS
from recjudge.evaluators.arena._prompts import ABSOLUTE
from recjudge.evaluators.arena._report import _header
from recjudge.evaluators.arena._systems import embedding_similarity
from recjudge.reward import ResultsStore, export_portable, import_portable


def rec(a, b, v, aspect="overall", u="1"):
    return {"user_id": u, "system_a": a, "system_b": b, "aspect": aspect, "verdict": v}


def test_q_arithmetic():
    assert q_score(6, 2, 2) == pytest.approx(8 / 4)
    assert q_score(0, 0, 3) == 0.0
    assert q_score(2, 0, 0) == float("inf")
    recs = [
        rec("x", "y", "A wins"),
        rec("x", "y", "A wins"),
        rec("y", "x", "A wins"),
        rec("x", "y", "Tie"),
    ]
    c = pair_counts(recs)[("x", "y")]
    assert (c["win"], c["tie"], c["lose"]) == (2, 1, 1)
    assert c["q"] == pytest.approx(3 / 2)
    assert c["win_pct"] == pytest.approx(50.0)
    q = system_q(recs)
    assert q["x"] == pytest.approx(3 / 2) and q["y"] == pytest.approx(2 / 3)


def test_order_swap_rule():
    # (A,B) says A; the swapped (B,A) says B, i.e. the original A again: consistent.
    assert combine_orders("A wins", "B wins") == ["A wins"]
    # both orders prefer whatever is in position A: position bias -> tie
    assert combine_orders("A wins", "A wins") == ["Tie"]
    assert combine_orders("Tie", "Tie") == ["Tie"]
    assert combine_orders("A wins", "A wins", "keep") == ["A wins", "B wins"]


def test_bradley_terry_recovers_known_strengths():
    truth = {"pop": -1.0, "itemknn": 0.0, "als": 0.5, "sasrec": 1.2}
    g = np.random.default_rng(0)
    names = list(truth)
    recs = []
    for _ in range(6000):
        a, b = g.choice(names, 2, replace=False)
        p = 1 / (1 + np.exp(truth[b] - truth[a]))
        recs.append(rec(a, b, "A wins" if g.random() < p else "B wins"))
    est = bradley_terry(recs)
    centred = {k: v - np.mean(list(truth.values())) for k, v in truth.items()}
    for k in names:
        assert est[k] == pytest.approx(centred[k], abs=0.1)
    s = summarize(recs, {"pop": 0.7, "itemknn": 0.8, "als": 0.85, "sasrec": 0.9}, bootstrap=50)
    lo, hi = s["bradley_terry"]["sasrec"]["ci95"]
    assert lo < est["sasrec"] < hi
    assert s["corr_bt_auc"]["spearman"] == pytest.approx(1.0)


def test_summarize_rejects_bad_records():
    with pytest.raises(ValueError, match="record 1: missing"):
        summarize([{"user_id": "1"}])
    with pytest.raises(ValueError, match="not one of"):
        summarize([rec("x", "y", "A")])
    with pytest.raises(ValueError, match="reference 'xx' is not a system.*did you mean 'x'"):
        summarize([rec("x", "y", "Tie")], reference="xx")


def test_offline_metric_oracles():
    assert ndcg_at(["a", "b", "c"], {"b"}, 5) == pytest.approx(1 / np.log2(3))
    assert ndcg_at(["a", "b"], {"z"}, 5) == 0.0
    same = lambda a, b: 1.0  # noqa: E731
    assert urd(["a", "b", "c"], same) == 0.0


def test_summarize_cli_on_records(tmp_path):
    path = tmp_path / "v.jsonl"
    path.write_text(
        "".join(json.dumps(rec("x", "y", v, u=str(n))) + "\n"
                for n, v in enumerate(["A wins", "A wins", "Tie", "B wins"]))
    )  # fmt: skip
    r = run_cli("arena", "summarize", "--verdicts", str(path), "--json", "--bootstrap", "10")
    assert r.code == 0, r.stderr
    out = r.stdout
    s = json.loads(out)
    c = s["pairs"]["overall"]["x vs y"]
    assert (c["win"], c["tie"], c["lose"], c["q"]) == (2, 1, 1, 1.5)


def test_summarize_cli_with_a_reference_reports_the_order_swap(tmp_path):
    def prec(a, b, pa, u):
        p = {"A wins": pa, "B wins": 1.0 - pa, "Tie": 0.0}
        return {**rec(a, b, "A wins" if pa > 0.5 else "B wins", u=u), "p_overall": p}

    # x: position A wins in both orders (a flip); y: y wins from both sides.
    recs = [prec("ref", "x", 0.9, "1"), prec("x", "ref", 0.7, "1")]
    recs += [prec("ref", "y", 0.2, "1"), prec("y", "ref", 0.6, "1")]
    path = tmp_path / "v.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))

    def cli(*args):
        return run_cli("arena", "summarize", "--verdicts", str(path), "--bootstrap", "10", *args)

    s = json.loads(cli("--reference", "ref", "--json").stdout)
    assert s["order_flip_rate"] == 0.5
    assert s["order_flip_by_system"] == {"x": 1.0, "y": 0.0}
    # x: 1/2 [0.1 + 0.7] = 0.4; y: 1/2 [0.8 + 0.6] = 0.7
    assert s["order_averaged"] == pytest.approx({"x": 0.4, "y": 0.7})
    text = cli("--reference", "ref").stdout
    assert "order-flip rate: 50.0 %" in text and "flip 100.0 %" in text
    wrong = cli("--reference", "rf")
    assert wrong.returncode != 0 and "did you mean 'ref'" in wrong.stderr
    assert "Traceback" not in wrong.stderr
    path.write_text(json.dumps({**recs[0], "p_overall": ["high", 0.1, 0.0]}) + "\n")
    bad = cli("--reference", "ref")
    assert bad.returncode != 0 and "record 1: p_overall" in bad.stderr


@pytest.mark.e2e
def test_arena_end_to_end_one_user(smollm, tmp_path):
    # The paper's protocol: each system in position A against the reference in B, one order.
    cfg = ArenaConfig(
        model="smollm2-135m",
        systems=("pop", "itemknn"),
        users=1,
        analysis_chars=10,
        absolute=True,
        bootstrap=20,
    )
    r = run_arena(cfg, "ml-100k", tmp_path, llm=smollm, progress=False)
    lines = [json.loads(x) for x in (tmp_path / "verdicts.jsonl").read_text().splitlines()]
    assert len(lines) == 7  # 1 user x 1 order x (6 aspects + overall)
    assert {(x["system_a"], x["system_b"]) for x in lines} == {("itemknn", "pop")}
    assert all(x["verdict"] in ("A wins", "B wins", "Tie") for x in lines)
    assert r["reference"] == "pop" and r["order_flip_rate"] is None
    c = r["reference_q"]["overall"]["itemknn"]
    assert c["win"] + c["tie"] + c["lose"] == 1
    assert set(r["reference_q"]) == {"overall", *ASPECTS}
    assert set(r["absolute_score"]) == {"pop", "itemknn"}
    assert all(0 <= v <= 1 for v in r["absolute_score"].values())
    assert (tmp_path / "winrates.png").stat().st_size > 1000
    report = (tmp_path / "report.md").read_text()
    assert "each system in position A against the reference **pop** in position B" in report
    assert "Deviations from the paper:** an absolute 5-level rating" in report
    assert 0.0 <= r["offline"]["pop"]["auc"] <= 1.0
    assert r["cost"]["questions"] == r["cost"]["asked_now"] == 3  # one order, 2 ratings
    assert "questions asked in this run" in report and "Q 95 % CI (users)" in report
    again = run_arena(cfg, "ml-100k", tmp_path, llm=smollm, progress=False)  # resumes: no work
    assert again["reference_q"] == r["reference_q"] and again["cost"]["asked_now"] == 0
    # The control judges the swapped order too (the stored first order is reused).
    both = run_arena(
        cfg.model_copy(update={"both_orders": True, "absolute": False}),
        "ml-100k",
        tmp_path,
        llm=smollm,
        progress=False,
    )
    lines = [json.loads(x) for x in (tmp_path / "verdicts.jsonl").read_text().splitlines()]
    assert len(lines) == 14 and both["order_flip_rate"] in (0.0, 1.0)
    assert both["reference_q"] == r["reference_q"]  # the headline stays the paper's order
    assert set(both["swap_rules"]) == {"tie", "keep"}
    assert both["swap_rules"]["keep"]["overall"]["itemknn"]["n"] == 2
    assert both["order_flip_by_system"] == {"itemknn": both["order_flip_rate"]}  # one challenger
    assert sum(both["position_shares"].values()) == pytest.approx(1.0)
    assert "| order-flip rate [95 % CI] |" in (tmp_path / "report.md").read_text()
    overall = [x for x in lines if x["aspect"] == "overall"]
    assert all(sum(x["p_overall"].values()) == pytest.approx(1.0, abs=1e-3) for x in overall)
    assert 0.0 <= both["order_averaged"]["itemknn"] <= 1.0

    # A title-free checkpoint carries the verdicts (not the analyses) to a fresh store,
    # and the run there needs no model.
    n = export_portable(tmp_path / "store.sqlite", tmp_path / "ck.gz")
    assert (n.results, n.left_out) == (4, 0)  # two orders, an absolute rating per system
    text = gzip.decompress((tmp_path / "ck.gz").read_bytes()).decode()
    with ResultsStore(tmp_path / "store.sqlite") as store:
        rows = list(store.rows())
    pairwise = [r["result"]["value"] for r in rows if "overall" in r["result"]["value"]]
    assert len(pairwise) == 2 and all(v["analysis"] for v in pairwise)  # stored, not exported
    assert '"analysis"' not in text
    closed = {*OPTIONS, *ABSOLUTE}  # every exported value is a closed verdict or rating
    exported = [json.loads(x)["result"]["value"] for x in text.splitlines()[1:]]
    assert all(set(v.values()) <= closed for v in exported)
    assert '"user_id"' not in text and '"system_a"' not in text  # no request
    fresh = tmp_path / "fresh"
    assert import_portable(tmp_path / "ck.gz", fresh / "store.sqlite").results == 4

    class NoModel:  # any model call fails the test
        def __getattr__(self, name):
            raise AssertionError(f"the model was used ({name})")

    resumed = run_arena(
        cfg.model_copy(update={"both_orders": True}), "ml-100k", fresh, llm=NoModel(),
        progress=False,
    )  # fmt: skip
    assert resumed["reference_q"] == r["reference_q"]
    assert resumed["order_flip_rate"] == both["order_flip_rate"]
    assert resumed["absolute_score"] == r["absolute_score"]


def test_reference_design_puts_the_system_under_test_in_a_and_the_reference_in_b():
    # RecSys Arena Table 2: "RS = A and FM = B"; the official script's --rec_a is the tested
    # system and --rec_b the reference (FM).
    cfg = ArenaConfig(systems=("pop", "itemknn", "als=runs/x"), reference="itemknn")
    assert cfg.orders() == [("pop", "itemknn"), ("als", "itemknn")]
    assert ArenaConfig(systems=("pop", "als")).orders() == [("als", "pop")]  # first = reference
    both = ArenaConfig(systems=("pop", "als"), both_orders=True).orders()
    assert both == [("als", "pop"), ("pop", "als")]  # the headline order first
    swapped = ArenaConfig(systems=("pop", "als"), reference_position="A")
    assert swapped.orders() == [("pop", "als")]
    assert any("reference in position A" in d for d in swapped.deviations())
    # The headline (Q per system) reads the order with the reference in its position.
    recs = [{"user_id": "1", "system_a": "als", "system_b": "pop", "aspect": "overall",
             "verdict": "A wins"},
            {"user_id": "1", "system_a": "pop", "system_b": "als", "aspect": "overall",
             "verdict": "A wins"}]  # fmt: skip
    assert [ArenaConfig(systems=("pop", "als")).is_headline(r) for r in recs] == [True, False]
    assert [swapped.is_headline(r) for r in recs] == [False, True]
    rr = ArenaConfig(systems=("pop", "als", "bpr"), design="round-robin").orders()
    assert len(rr) == 6 and ("als", "bpr") in rr and ("bpr", "als") in rr
    assert ArenaConfig().deviations() == []  # the defaults are the paper's protocol
    assert any("round-robin" in d for d in ArenaConfig(design="round-robin").deviations())
    with pytest.raises(ValueError, match="did you mean 'itemknn'"):
        ArenaConfig(systems=("pop", "itemknn"), reference="itemkn")
    with pytest.raises(ValueError, match="twice"):
        ArenaConfig(systems=("pop", "pop"))


def test_report_header_names_the_orders_actually_judged():
    one = "\n".join(_header(ArenaConfig(systems=("pop", "als")), "d", {"reference": "pop"}, 3))
    assert "one order per user (the paper's protocol)" in one
    cfg = ArenaConfig(systems=("pop", "als"), both_orders=True)
    both = "\n".join(_header(cfg, "d", {"reference": "pop"}, 3))
    assert "judged in both orders" in both and "one order per user" not in both
    rr = ArenaConfig(systems=("pop", "als"), design="round-robin")
    assert "every pair in both orders" in "\n".join(_header(rr, "d", {"reference": None}, 3))


def test_reference_q_is_from_the_systems_side():
    recs = [
        rec("ref", "x", "B wins"),  # x beats the reference
        rec("ref", "x", "B wins"),
        rec("ref", "x", "Tie"),
        rec("ref", "x", "A wins"),
        rec("x", "ref", "A wins"),  # reference in position B: x wins
        rec("ref", "y", "A wins"),
        rec("x", "y", "A wins"),  # not against the reference: ignored
    ]
    q = reference_q(recs, "ref")
    assert (q["x"]["win"], q["x"]["tie"], q["x"]["lose"]) == (3, 1, 1)
    assert q["x"]["q"] == pytest.approx((3 + 1) / (1 + 1))
    assert q["y"]["q"] == 0.0 and set(q) == {"x", "y"}
    s = summarize(recs, reference="ref", bootstrap=0)
    assert s["reference_q"]["overall"]["x"]["q"] == pytest.approx(2.0)


def test_swap_rules_on_per_order_records():
    per_order = [
        rec("ref", "x", "A wins", u="1"),
        rec("x", "ref", "A wins", u="1"),  # both prefer position A: a flip -> tie
        rec("ref", "x", "B wins", u="2"),
        rec("x", "ref", "A wins", u="2"),  # consistent: x wins from both sides
        rec("ref", "y", "Tie", u="1"),  # judged in one order only: kept
    ]
    tie = swap_rule_records(per_order, "tie")
    assert [r["verdict"] for r in tie] == ["Tie", "B wins", "Tie"]
    assert swap_rule_records(per_order, "keep") == per_order
    assert order_flip_rate(per_order) == 0.5
    with pytest.raises(ValueError, match="swap rule"):
        swap_rule_records(per_order, "drop")


def test_correlations_report_p_values():
    from scipy.stats import pearsonr

    x = {"a": 1.0, "b": 2.0, "c": 3.0, "d": 5.0}
    y = {"a": 0.6, "b": 0.7, "c": 0.65, "d": 0.9}
    c = correlations(x, y)
    r, p = pearsonr([1, 2, 3, 5], [0.6, 0.7, 0.65, 0.9])
    assert c["pearson"] == pytest.approx(r) and c["pearson_p"] == pytest.approx(p)
    assert 0 < c["spearman_p"] <= 1 and c["n"] == 4
    flat = correlations(x, dict.fromkeys(x, 0.5))
    assert flat["pearson"] is None and flat["n"] == 4  # undefined, not a warning and nan


def test_prompt_defines_the_six_aspects_and_asks_for_each_analysis():
    msgs = arena_messages("male, 25-34", ["Heat (1995)"], ["Alien (1979)"], ["Up (2009)"], 100)
    text = msgs[1]["content"]
    for aspect, definition in ASPECT_DEFINITIONS.items():
        assert f"- {aspect}: {definition.format(word='movies')}" in text
    assert "per aspect" in text and '"analysis": {"accuracy"' in text
    joint = arena_messages("", ["H"], ["A"], ["B"], 100, per_aspect=False)[1]["content"]
    assert '"analysis": "..."' in joint


def test_embedding_similarity_is_cosine():
    class M:
        item_index = {"a": 0, "b": 1, "c": 2}

        def item_embeddings(self):
            return np.array([[1.0, 0.0], [2.0, 0.0], [0.0, 3.0]])

    sim = embedding_similarity(M())
    assert sim("a", "b") == pytest.approx(1.0) and sim("a", "c") == pytest.approx(0.0)
    assert urd(["a", "b", "c"], sim) == pytest.approx(1 - 1 / 3)
    assert sim("a", "zzz") == 0.0


def _vs_reference(verdicts, system="x"):
    """One overall record per user: the reference in position A against ``system``."""
    return [rec("ref", system, v, u=str(i)) for i, v in enumerate(verdicts)]


def test_reference_q_ci_brackets_q_and_collapses_when_every_user_agrees():
    # From x's side: 12 wins (reference loses), 4 ties, 4 losses: Q = 16 / 8 = 2.
    mixed = _vs_reference(["B wins"] * 12 + ["Tie"] * 4 + ["A wins"] * 4)
    assert reference_q(mixed, "ref")["x"]["q"] == 2.0
    lo, hi = reference_q_ci(mixed, "ref", n=500)["x"]
    assert lo < 2.0 < hi
    assert reference_q_ci(_vs_reference(["Tie"] * 10), "ref", n=200)["x"] == (1.0, 1.0)
    # Q is undefined (no lose or tie) in every draw: no interval rather than inf.
    assert reference_q_ci(_vs_reference(["B wins"] * 10), "ref", n=200)["x"] is None


def test_order_flip_ci_resamples_users_not_records():
    both = []
    for i in range(20):  # users 0-9 flip (A wins in both orders), 10-19 agree
        u = str(i)
        both += [
            rec("ref", "x", "A wins", u=u),
            rec("x", "ref", "A wins" if i < 10 else "B wins", u=u),
        ]
    assert order_flip_rate(both) == 0.5
    lo, hi = order_flip_ci(both, n=500)
    assert 0.2 < lo < 0.5 < hi < 0.8
    flips = [r for r in both if int(r["user_id"]) < 10]
    assert order_flip_ci(flips, n=100) == (1.0, 1.0)  # a drawn user twice is two pairs
    assert order_flip_ci(both[:1], n=100) is None  # one order only: no flip rate


def test_order_flip_by_system_and_position_shares():
    per_order = []
    for i in range(10):  # x: position A always wins (flips); y: y wins from both sides
        u = str(i)
        per_order += [
            rec("ref", "x", "A wins", u=u),
            rec("x", "ref", "A wins", u=u),
            rec("ref", "y", "B wins", u=u),
            rec("y", "ref", "A wins", u=u),
        ]
    per_order.append(rec("ref", "z", "Tie", u="0"))  # one order only: no rate for z
    flips = order_flip_by_system(per_order, "ref")
    assert flips == {"x": 1.0, "y": 0.0, "z": None}
    assert order_flip_rate(per_order) == 0.5  # the overall rate mixes the two
    ci = order_flip_by_system_ci(per_order, "ref", n=200)
    assert ci["x"] == (1.0, 1.0) and ci["y"] == (0.0, 0.0) and ci["z"] is None
    shares = position_shares(per_order)
    assert shares == pytest.approx({"A wins": 30 / 41, "B wins": 10 / 41, "Tie": 1 / 41})
    assert position_shares([]) == {}


def test_order_averaged_preference_cancels_the_position():
    def prec(a, b, pa, pb, u):
        p = {"A wins": pa, "B wins": pb, "Tie": 1.0 - pa - pb}
        return {**rec(a, b, "A wins" if pa > pb else "B wins", u=u), "p_overall": p}

    records = []
    for i in range(12):
        u = str(i)
        # The judge prefers position A by 0.9 whatever it reads, then x a little over ref
        # (0.06 either way) and y a little under it: the verdicts are all "A wins".
        records += [
            prec("ref", "x", 0.90 - 0.06, 0.04 + 0.06, u),
            prec("x", "ref", 0.90 + 0.06, 0.04 - 0.03, u),
            prec("ref", "y", 0.90 + 0.06, 0.04 - 0.03, u),
            prec("y", "ref", 0.90 - 0.06, 0.04 + 0.06, u),
        ]
    assert {r["verdict"] for r in records} == {"A wins"}
    pref = order_averaged_preference(records, "ref")
    # x: 1/2 [(0.10 + 0.03) + (0.96 + 0.015)] = 0.5525; y: 1/2 [(0.01 + 0.015) + (0.84 + 0.03)]
    assert pref["x"] == pytest.approx(0.5525) and pref["y"] == pytest.approx(0.4475)
    ci = order_averaged_preference_ci(records, "ref", n=100)
    assert ci["x"] == pytest.approx((0.5525, 0.5525)) and ci["y"][1] < 0.5 < ci["x"][0]
    # A list in OPTIONS order (verdict files written before the dict) reads the same.
    as_lists = [
        {**r, "p_overall": [r["p_overall"][o] for o in ("A wins", "B wins", "Tie")]}
        for r in records
    ]
    assert order_averaged_preference(as_lists, "ref") == pytest.approx(pref)
    one_order = [r for r in records if r["system_a"] == "ref"]
    assert order_averaged_preference(one_order, "ref") == {"x": None, "y": None}


def test_order_flip_rate_counts_each_pair_once_under_both_swap_rules():
    def both(v):
        return {a: v for a in (*ASPECTS, "overall")}

    # (x, y): A wins, and from the swapped side B wins = the same verdict (no flip);
    # (x, z): A wins both times from each side's A = a flip.
    judged = [("x", "y", "A wins", "B wins"), ("x", "z", "A wins", "A wins")]
    for rule in ("tie", "keep"):
        records = [
            r
            for a, b, v_ab, v_ba in judged
            for r in pair_records("u1", a, b, both(v_ab), both(v_ba), rule)
        ]
        overall = [r for r in records if r["aspect"] == "overall"]
        assert len(overall) == (2 if rule == "tie" else 4)
        assert all("order_flip" in r for r in overall)
        assert order_flip_rate(records) == 0.5, rule


def test_summarize_refuses_hostile_verdict_files_in_one_line_and_counts_repeats_once(tmp_path):
    """Issue 91: non-UTF-8 file, integer system_a, list aspect and string AUCs were
    tracebacks; a repeated record counted twice; --json printed Infinity."""
    path = tmp_path / "v.jsonl"

    def cli(*args):
        return run_cli("arena", "summarize", "--verdicts", str(path), "--bootstrap", "10", *args)

    path.write_bytes(b'{"user_id": "1", "system_a": "\xff\xfe"}\n')
    r = cli()
    assert r.code == 2 and "not UTF-8" in r.stderr and "Traceback" not in r.stderr
    for field, value in (("system_a", 7), ("aspect", ["overall"])):
        path.write_text(json.dumps({**rec("x", "y", "A wins"), field: value}) + "\n")
        r = cli()
        assert r.code == 2 and field in r.stderr and "row 1" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
    good = [rec("x", "y", v, u=str(n)) for n, v in enumerate(["A wins", "Tie", "B wins"])]
    path.write_text("".join(json.dumps(x) + "\n" for x in good + good))  # every one twice
    r = cli("--json")
    assert r.code == 0 and "3 repeated record(s) counted once" in r.stderr
    c = json.loads(r.stdout)["pairs"]["overall"]["x vs y"]
    assert (c["win"], c["tie"], c["lose"]) == (1, 1, 1)
    assert "Infinity" not in r.stdout and "NaN" not in r.stdout
    auc = tmp_path / "auc.json"
    auc.write_text(json.dumps({"x": "high", "y": None}))
    r = cli("--auc", str(auc))
    assert r.code == 2 and "'x' has 'high'" in r.stderr and "Traceback" not in r.stderr
