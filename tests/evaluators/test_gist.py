"""GISTBench: hand-computed scores, the predicate table, oracle union, seeded sampling, e2e."""

from __future__ import annotations

import gzip
import json
import sqlite3
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

import recjudge.decoding._decode as decode_module
from cli_in_process import run_cli
from recjudge._util import UserFacingError
from recjudge.data import DataError, TitleScreen
from recjudge.evaluators import (
    GistConfig,
    Predicate,
    build_oracle,
    echoes_example,
    gist_differences,
    gist_intervals,
    gist_scores,
    global_pool,
    load_categories,
    names_signal,
    run_gist,
    specificity_options,
    user_scores,
    verify_profiles,
)
from recjudge.evaluators.gist import _pipeline as _gist_pipeline
from recjudge.evaluators.gist import _pipeline as gp
from recjudge.evaluators.gist._gist import extraction_messages, specificity_evidence
from recjudge.evaluators.gist._pipeline import (
    _count_citations,
    _Interest,
    _spec_jobs,
    _title_free_extraction,
    read_profiles,
    taxonomy_rule,
)
from recjudge.evaluators.gist._report import _pr_draw, _report_notes
from recjudge.llm import ENGINE_CAPABILITIES, BackendError, Capabilities, _fast
from recjudge.reward import ResultsStore, export_portable, import_portable


def rec(user, model, cat, verified, correct=0, backing=0, interest=None):
    return {
        "user_id": user,
        "model": model,
        "interest": interest or f"{cat}-{verified}-{correct}",
        "category_id": cat,
        "verified": verified,
        "correct": correct,
        "backing": backing,
    }


def test_taxonomy_is_the_papers_325_categories():
    cats = load_categories()
    assert len(cats) == 325
    assert sorted(cats) == list(range(1, 326))
    assert cats[1] == "A.I. Art"
    assert "Movies & TV Reviews or Commentary" in cats.values()


def test_bad_taxonomy_file_names_the_line(tmp_path):
    p = tmp_path / "cats.csv"
    p.write_text("category_id,category_name\n1,Art\nx,Broken\n")
    with pytest.raises(ValueError, match=r"cats.csv, line 3"):
        load_categories(p)


SHORT = ["insufficient_imp+", "insufficient_exp+"]


@pytest.mark.parametrize(
    ("counts", "verified", "reasons"),
    [
        ({"imp+": 3}, True, []),
        ({"imp+": 2}, False, SHORT),
        ({"exp+": 2}, True, []),
        ({"exp+": 1, "imp+": 2}, True, []),
        ({"exp+": 1, "imp+": 1}, False, SHORT),
        # Table 7 names each failure by its own condition on every unverified interest: 5
        # implicit positives are enough (no insufficient_imp+), 0 explicit ones are not.
        ({"imp+": 5, "imp-": 4}, False, ["insufficient_exp+", "excess_imp-"]),
        ({"imp+": 5, "imp-": 3}, True, []),
        ({"exp+": 2, "exp-": 3}, False, ["insufficient_imp+", "excess_exp-"]),
        ({"exp+": 2, "exp-": 2}, True, []),
        ({"imp+": 4, "exp+": 3, "exp-": 3}, False, ["excess_exp-"]),
        # Failure modes are not exclusive (Table 7): every one that applies is named.
        ({"imp-": 4, "exp-": 3}, False, [*SHORT, "excess_imp-", "excess_exp-"]),
        ({}, False, ["no_evidence", *SHORT]),
    ],
)
def test_predicate_table(counts, verified, reasons):
    assert Predicate().check(counts) == (verified, reasons)


def test_predicate_thresholds_are_configurable_and_described():
    strict = Predicate(imp_pos=5, max_exp_neg=0)
    assert strict.check({"imp+": 4}) == (False, SHORT)
    assert strict.check({"imp+": 5, "exp-": 1}) == (False, ["insufficient_exp+", "excess_exp-"])
    words = strict.describe()
    assert "at least 5 implicit_positive" in words and "more than 0 explicit_negative" in words


def test_an_object_engaged_twice_counts_under_each_of_its_event_types(monkeypatch):
    """GISTBench's official code counts a cited object under every type it has; a history
    read as a dict kept only its oldest event (here the view, not the rating)."""
    monkeypatch.setattr(gp, "_relevant", lambda run, pairs, desc: {p: (True, 0.9) for p in pairs})
    history = [("m1", "explicit_positive"), ("m2", "implicit_positive"),
               ("m1", "implicit_positive")]  # most recent first  # fmt: skip
    run = SimpleNamespace(histories={"u": history}, config=GistConfig())
    (rec,) = gp._ground(run, [gp._Interest("u", "m", "old films", ["m1"])])
    assert rec["counts"] == {"imp+": 1, "exp+": 1, "imp-": 0, "exp-": 0}


def test_failure_modes_are_shares_of_unverified_interests():
    recs = [
        {**rec("u", "m", 1, False, 0, 0), "reasons": ["no_evidence", *SHORT]},
        {**rec("u", "m", 2, False, 0, 0), "reasons": ["excess_imp-"]},
        {**rec("u", "m", 3, True, 0, 0), "reasons": []},
        {**rec("u", "m", 4, True, 0, 0), "reasons": []},
    ]
    s = gist_scores(recs)["m"]
    assert s["unverified"] == 2
    # Over the 2 unverified interests (not all 4), and summing to more than 100 %.
    assert s["failure_pct"] == {
        "excess_imp-": 50.0,
        "insufficient_exp+": 50.0,
        "insufficient_imp+": 50.0,
        "no_evidence": 50.0,
    }


@pytest.mark.parametrize(
    ("interest", "echoes"),
    [
        ("1990s crime thrillers", True),
        ("1980s Crime  Thrillers", True),
        ("1992 crime-thrillers", True),
        ("Crime thrillers", True),
        ("thrillers crime", True),  # the same words
        ("legal thrillers", False),
        ("crime thrillers and mysteries", False),
        ("crime", False),
        ("1990s", False),
    ],
)
def test_an_interest_echoes_the_example_up_to_its_numbers(interest, echoes):
    assert echoes_example(interest, "1990s crime thrillers") is echoes
    assert echoes_example(interest, "2001") is False  # an example of numbers only: never


def test_echoes_of_the_example_are_counted_per_model():
    recs = [
        {**rec("u", "m", 1, True), "echoes_example": True},
        {**rec("u", "m", 2, False), "echoes_example": True},
        {**rec("u", "m", 3, True), "echoes_example": False},
        rec("u", "n", 1, True),  # records without the flag (older runs) count as no echo
    ]
    s = gist_scores(recs)
    assert (s["m"]["echoes_example"], s["m"]["echoes_verified"]) == (2, 1)
    assert (s["n"]["echoes_example"], s["n"]["echoes_verified"]) == (0, 0)


@pytest.mark.parametrize(
    ("interest", "names"),
    [
        ("explicit positive", True),
        ("Explicitly Positive", True),
        ("implicit_negative", True),
        (" implicit negatives ", True),
        ("explicit-positive.", True),
        ("explicit thrillers", False),
        ("positive psychology", False),
        ("implicit positive thrillers", False),
        ("explicit", False),
        ("", False),
    ],
)
def test_an_interest_that_only_names_a_signal_of_the_prompt(interest, names):
    assert names_signal(interest) is names


def test_a_model_under_test_without_any_interest_is_scored_zero_not_dropped():
    recs = [rec("u", "m", 1, True), rec("v", "m", 2, True)]
    s = gist_scores(recs, users=["u", "v"], models=["m", "silent"])
    assert list(s) == ["m", "silent"]
    quiet = s["silent"]
    assert quiet["interests"] == 0 and quiet["verified_pct"] == 0.0
    assert all(quiet[k] == 0.0 for k in ("ig_p", "ig_r", "ig_f1", "is"))
    assert set(quiet["users"]) == {"u", "v"}
    assert s["m"]["ig_r"] == 1.0  # the oracle is unchanged by the silent model
    assert list(gist_scores(recs)) == ["m"]  # without ``models``: the models in the records


def test_signal_names_are_counted_per_model_and_reported():
    recs = [
        {**rec("u", "m", 1, True), "names_signal": True},
        {**rec("u", "m", 2, False), "names_signal": True},
        {**rec("u", "m", 3, True), "names_signal": False},
        rec("u", "n", 1, True),  # records without the flag (older runs) count as none
    ]
    s = gist_scores(recs)
    assert (s["m"]["signal_names"], s["m"]["signal_names_verified"]) == (2, 1)
    assert (s["n"]["signal_names"], s["n"]["signal_names_verified"]) == (0, 0)

    base = {"incomplete_extractions": 0, "filled_distractors": 0, "prompt_example": "x y"}
    lines = "\n".join(_report_notes(GistConfig(), {**base, "scores": s}))
    assert "m 2 of 3 (1 verified)" in lines and "n 0 of 1 (0 verified)" in lines
    # A results file written before the count (no key) renders without the line.
    old = {m: {k: v for k, v in x.items() if not k.startswith("signal_")} for m, x in s.items()}
    assert "engagement signal" not in "\n".join(
        _report_notes(GistConfig(), {**base, "scores": old})
    )
    # Nor do profiles from the user's own system (``gist verify``): the tags are our prompt's.
    theirs = {**base, "prompt_example": None, "scores": s}
    assert "engagement signal" not in "\n".join(_report_notes(GistConfig(), theirs))


def test_the_pr_plot_draws_each_model_dots_and_median_in_one_colour():
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_rgb

    users = {"u": {"ig_p": 0.5, "ig_r": 0.5}, "v": {"ig_p": 1.0, "ig_r": 0.0}}
    scores = {m: {"ig_p": 0.5, "ig_r": 0.5, "users": users} for m in ("a", "b", "c")}
    fig, ax = plt.subplots()
    _pr_draw(ax, scores, "toy")
    dots_and_stars = ax.collections
    assert len(dots_and_stars) == 6
    rgb = [to_rgb(c.get_facecolor()[0]) for c in dots_and_stars]
    for i in range(3):  # per model: its dots, then its median star
        assert rgb[2 * i] == rgb[2 * i + 1]
    assert len({rgb[0], rgb[2], rgb[4]}) == 3  # and the models differ
    plt.close(fig)


def test_the_extraction_prompt_speaks_of_the_domain_and_the_configured_example():
    lines = ["[1] explicit_positive - Emma by Jane Austen (1815)"]
    books = extraction_messages(lines, "books", GistConfig())[1]["content"]
    assert 'not "books"' in books and "movies" not in books
    assert '"1990s crime thrillers"' in books  # the default example
    own = extraction_messages(lines, "podcasts", GistConfig(interest_example="true crime"))
    assert '"true crime"' in own[1]["content"] and "crime thrillers" not in own[1]["content"]


def test_specificity_evidence_is_sampled_from_the_cited_set():
    cited = [str(i) for i in range(12)]
    picks = {tuple(specificity_evidence(cited, 5, ("s", n))) for n in range(20)}
    assert all(len(p) == 5 and set(p) <= set(cited) for p in picks)
    assert len(picks) > 1  # sampled, not the first five
    assert specificity_evidence(cited, 5, ("s", 1)) == specificity_evidence(cited, 5, ("s", 1))
    assert specificity_evidence(["a", "b", "a"], 5, 0) == ["a", "b"]


def test_citation_rule_is_instructed_and_counted_not_enforced_by_default():
    def interests():
        return [_Interest("u", "m", f"i{k}", ["x", "y"]) for k in range(3)]

    kept = interests()
    _count_citations(kept, 2, enforce=False)
    assert [it.ids for it in kept] == [["x", "y"]] * 3
    assert [it.over_limit_citations for it in kept] == [0, 0, 2]
    dropped = interests()
    _count_citations(dropped, 2, enforce=True)
    assert dropped[2].ids == [] and dropped[2].over_limit_citations == 2


def test_defaults_are_the_papers_protocol():
    cfg = GistConfig()
    assert cfg.deviations() == []
    assert cfg.max_history is None and cfg.max_interests is None and cfg.taxonomy == "full"
    devs = GistConfig(max_history=100, max_interests=8, taxonomy="shortlist").deviations()
    assert len(devs) == 3 and any("325" in d for d in devs)


def test_user_scores_by_hand_with_taxonomy():
    # Category 1: two interests, one verified -> G = 0.5; S = (2 + 1) / (4 + 2) = 0.5.
    # Category 2: one verified interest -> G = 1; S = 3 / 3 = 1.
    # Category 3: one unverified interest -> G = 0 (its S does not count for IS).
    rs = [
        rec("u", "m", 1, True, 2, 4),
        rec("u", "m", 1, False, 1, 2),
        rec("u", "m", 2, True, 3, 3),
        rec("u", "m", 3, False, 0, 5),
    ]
    s = user_scores(rs, oracle={1, 2, 4, 5})
    assert s["ig_p"] == pytest.approx(1.5 / 3)
    assert s["ig_r"] == pytest.approx(1.5 / 4)
    p, r = 0.5, 0.375
    assert s["ig_f1"] == pytest.approx(2 * p * r / (p + r))
    assert s["is"] == pytest.approx((0.5 + 1.0) / 2)
    assert (s["interests"], s["categories"], s["oracle"]) == (4, 3, 4)


def test_scores_without_taxonomy_each_interest_is_a_category():
    rs = [
        rec("u", "a", "jazz records", True, 1, 2),
        rec("u", "a", "old westerns", False, 0, 1),
        rec("u", "b", "jazz records", True, 2, 2),
        rec("u", "b", "war films", True, 0, 3),
    ]
    s = gist_scores(rs)
    # Oracle for u = {jazz records, war films}.
    assert s["a"]["ig_p"] == pytest.approx(0.5)
    assert s["a"]["ig_r"] == pytest.approx(0.5)
    assert s["a"]["is"] == pytest.approx(0.5)
    assert s["b"]["ig_p"] == pytest.approx(1.0)
    assert s["b"]["ig_r"] == pytest.approx(1.0)
    assert s["b"]["is"] == pytest.approx((1.0 + 0.0) / 2)


def test_oracle_union_medians_and_missing_users():
    rs = [
        rec("u1", "a", 1, True),
        rec("u1", "b", 2, True),
        rec("u1", "b", 3, False),
        rec("u2", "a", 1, False),
    ]
    assert build_oracle(rs) == {"u1": [1, 2], "u2": []}
    s = gist_scores(rs, users=["u1", "u2", "u3"])
    # a: u1 P=1 R=0.5; u2 P=0 R=0 (empty oracle); u3 no interests -> 0. Medians: 0, 0.
    assert s["a"]["users"]["u1"]["ig_r"] == pytest.approx(0.5)
    assert s["a"]["users"]["u3"]["interests"] == 0
    assert s["a"]["ig_p"] == 0.0
    # b: u1 P = 1/2, R = 1/2; u2, u3 zero -> median 0.
    assert s["b"]["users"]["u1"]["ig_p"] == pytest.approx(0.5)
    # An imported oracle replaces the union.
    s2 = gist_scores(rs, oracle={"u1": [1, 2, 3, 4]})
    assert s2["a"]["users"]["u1"]["ig_r"] == pytest.approx(0.25)


def _scores(per_user):
    """gist_scores-shaped output from {model: {user: (ig_p, ig_r, ig_f1, is)}}."""
    keys = ("ig_p", "ig_r", "ig_f1", "is")
    return {
        m: {"users": {u: dict(zip(keys, v, strict=True)) for u, v in us.items()}}
        for m, us in per_user.items()
    }


def test_gist_intervals_bracket_the_median_and_test_precision_minus_recall():
    users = [f"u{i}" for i in range(40)]
    flat = {u: (0.5, 0.25, 1 / 3, 0.2) for u in users}  # every user alike: no spread
    spread = {u: (i / 39, 0.0, 0.0, 0.0) for i, u in enumerate(users)}
    iv = gist_intervals(_scores({"flat": flat, "spread": spread}), draws=400, seed=0)
    assert iv["flat"]["ig_p"] == {"lo": 0.5, "hi": 0.5}
    assert iv["flat"]["p_minus_r"] == pytest.approx({"estimate": 0.25, "lo": 0.25, "hi": 0.25})
    med = float(np.median([i / 39 for i in range(40)]))
    assert iv["spread"]["ig_p"]["lo"] < med < iv["spread"]["ig_p"]["hi"]
    assert iv["spread"]["p_minus_r"]["estimate"] == pytest.approx(0.5)
    assert gist_intervals(_scores({"flat": flat}), draws=0) == {}
    with pytest.raises(ValueError, match="other users"):
        gist_intervals(_scores({"a": flat, "b": dict(list(flat.items())[:5])}), draws=10)


def test_gist_differences_are_paired_and_separate_only_what_differs():
    users = [f"u{i}" for i in range(40)]
    base = {u: (i / 39, i / 78, i / 50, i / 100) for i, u in enumerate(users)}
    ahead = {u: (v[0] + 0.3, v[1], v[2] + 0.1, v[3]) for u, v in base.items()}  # same users
    d = gist_differences(_scores({"ahead": ahead, "base": base, "same": base}), 400, seed=0)
    assert list(d) == ["ahead minus base", "ahead minus same", "base minus same"]
    gap = d["ahead minus base"]
    # Shifting every user moves the median by the shift, in every resample: a paired
    # interval collapses to the shift although each model's own interval is wide.
    assert gap["ig_p"] == pytest.approx({"estimate": 0.3, "lo": 0.3, "hi": 0.3})
    assert gap["ig_f1"]["lo"] == pytest.approx(0.1) and gap["ig_r"]["estimate"] == 0.0
    assert d["base minus same"]["is"] == {"estimate": 0.0, "lo": 0.0, "hi": 0.0}
    # Two unrelated spreads: the interval straddles 0.
    rev = {u: base[users[39 - i]] for i, u in enumerate(users)}
    mixed = gist_differences(_scores({"a": base, "b": rev}), 400, seed=0)["a minus b"]["ig_p"]
    assert mixed["lo"] < 0 < mixed["hi"]
    assert gist_differences(_scores({"a": base}), 400) == {}
    with pytest.raises(ValueError, match="other users"):
        gist_differences(_scores({"a": base, "b": dict(list(base.items())[:5])}), 10)


def test_score_records_need_fields():
    with pytest.raises(ValueError, match="record 0 lacks"):
        gist_scores([{"user_id": "u", "model": "m"}])


POOL_SCRIPT = """
import json
from recjudge.evaluators import global_pool, specificity_options
h = {str(u): [f"i{u}-{k}" for k in range(u % 7 + 1)] for u in range(300)}
pool = global_pool(h, 100, seed=3)
opts = specificity_options(["e1", "e2"], pool[:10], ("u", "m", "interest"))
print(json.dumps([pool, opts]))
"""


def test_specificity_sampling_is_identical_across_processes():
    runs = [
        subprocess.run(
            [sys.executable, "-c", POOL_SCRIPT],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": str(seed), "PATH": ""},
        ).stdout
        for seed in (1, 2)
    ]
    assert runs[0] == runs[1]
    pool, (opts, is_ev) = json.loads(runs[0])
    assert len(pool) == len(set(pool)) == 100
    assert sorted(o for o, e in zip(opts, is_ev, strict=True) if e) == ["e1", "e2"]
    assert len(opts) == 12
    other = specificity_options(["e1", "e2"], pool[:10], ("u", "m", "other interest"))[0]
    assert other != opts  # the order depends on the seed parts


def test_pool_is_uniform_over_users_not_interactions():
    # One heavy user with 1000 objects and 99 users with one object each: sampling users
    # uniformly gives the heavy user ~1/100 of draws; sampling interactions would give ~90 %.
    h = {"heavy": [f"h{k}" for k in range(1000)]}
    h.update({f"u{k}": [f"o{k}"] for k in range(99)})
    pool = global_pool(h, 60, seed=0)
    heavy = sum(o.startswith("h") for o in pool)
    assert heavy <= 6


def test_config_round_trip():
    cfg = GistConfig(models=("a", "b"), judge="j", users=3, predicate=Predicate(imp_pos=4))
    assert GistConfig.model_validate_json(cfg.model_dump_json()) == cfg


def one_cited_interest(monkeypatch) -> None:
    """Top up what the extraction parsed with one interest that cites the user's two most
    recent items, for each model and user that got none with a citation.

    What SmolLM2 writes differs by dtype and CPU (in bf16 on some CPUs it writes no usable
    interest), and a run with no cited interest never reaches the evidence filter. The
    extraction still decodes and stores the model's own answers; this only guarantees that the
    later stages have something to check, whatever the model wrote."""
    real = _gist_pipeline._extract

    def extract(run):
        interests, incomplete = real(run)
        for m in run.config.models:
            for u in run.users:
                if not any(it.ids for it in interests if (it.model, it.user_id) == (m, u)):
                    ids = [i for i, _ in run.histories[u][:2]]
                    interests.append(_gist_pipeline._Interest(u, m, "old crime films", ids))
        return interests, incomplete

    monkeypatch.setattr(_gist_pipeline, "_extract", extract)


@pytest.mark.e2e
def test_gist_end_to_end_one_real_user(smollm, ml100k, tmp_path, monkeypatch):
    one_cited_interest(monkeypatch)

    # The taxonomy's first 40 categories (the paper's ids and names): the wiring of the full
    # choice and its agreement with the shortlist is under test, not the size of one choice
    # (all 325: ~20 s on a 2-core AVX2 CPU in fp32; test_choice scores whole options).
    full = load_categories()
    some = dict(list(full.items())[:40])
    monkeypatch.setattr(_gist_pipeline, "load_categories", lambda: some)
    cfg = GistConfig(
        models=("smollm2-135m",),
        judge="smollm2-135m",
        users=1,
        max_history=20,
        max_interests=2,
        max_ids=3,
        options=8,
        pool_size=40,
        taxonomy="shortlist",
        shortlist=6,
        agreement_sample=1,  # one full choice among the 40 categories
    )
    llms = {"smollm2-135m": smollm}
    r = run_gist(cfg, "ml-100k", tmp_path, llms=llms, progress=False)
    lines = [json.loads(x) for x in (tmp_path / "interests.jsonl").read_text().splitlines()]
    assert lines  # at least the topped-up interest
    for x in lines:
        assert x["user_id"] in r["users"]
        assert 2 <= len(x["interest"].split()) <= 5
        assert set(x["surviving"]) <= set(x["cited"])
        assert x["verified"] == Predicate().check(x["counts"])[0]
        assert 1 <= x["category_id"] <= 325
        assert x["echoes_example"] == echoes_example(x["interest"], "1990s crime thrillers")
        assert x["names_signal"] == names_signal(x["interest"])
        if x["backing"]:
            assert 0 <= x["correct"] <= x["backing"]
            assert x["backing"] + x["distractors"] == 8
    assert set(r["scores"]) == set(cfg.models)  # every model under test, interests or none
    s = r["scores"]["smollm2-135m"]
    for k in ("ig_p", "ig_r", "ig_f1", "is"):
        assert 0.0 <= s[k] <= 1.0
    assert (tmp_path / "pr.png").stat().st_size > 1000
    report = (tmp_path / "report.md").read_text()
    assert "IG_F1" in report and "grammar caps" in report  # deviations named in the header
    echoes = s["echoes_example"]
    assert f"smollm2-135m {echoes} of {s['interests']}" in report  # the prompt's example
    assert f"smollm2-135m {s['signal_names']} of {s['interests']}" in report  # signal tags
    # The shortlist's agreement with the full 325-category choice is measured and reported.
    agree = r["taxonomy_agreement"]
    assert agree["n"] == min(1, len({x["interest"] for x in lines}))
    assert 0 <= agree["agree"] <= agree["n"] and "agrees with the full" in report
    oracle = json.loads((tmp_path / "oracle.json").read_text())["oracle"]
    assert set(oracle) == set(r["users"])
    # The scorer on the written records reproduces the run's scores.
    assert gist_scores(lines, oracle, r["users"])["smollm2-135m"]["ig_f1"] == s["ig_f1"]
    iv = r["intervals"]["smollm2-135m"]
    for k in ("ig_p", "ig_r", "ig_f1", "is"):
        assert iv[k]["lo"] <= s[k] <= iv[k]["hi"]
    assert r["cost"]["extraction"]["asked_now"] > 0 and r["cost"]["judge"]["asked_now"] > 0
    # A rerun resumes from the store and changes nothing.
    again = run_gist(cfg, "ml-100k", tmp_path, llms=llms, progress=False)
    assert again["scores"] == r["scores"]
    assert again["cost"]["extraction"]["asked_now"] == again["cost"]["judge"]["asked_now"] == 0
    _carried_to_a_fresh_store(cfg, r, llms, ml100k, tmp_path)


def _carried_to_a_fresh_store(cfg, first, llms, ds, tmp_path):
    """A title-free checkpoint of the run resumes it in a fresh folder: every exported answer
    is read, not asked; only extraction answers that name a history title stayed behind."""
    n = export_portable(tmp_path / "store.sqlite", tmp_path / "ck.gz")
    text = gzip.decompress((tmp_path / "ck.gz").read_bytes()).decode()
    titles = dict(zip(ds.items["item_id"].astype(str), ds.items["title"], strict=True))
    seen = [titles[i] for u in first["users"] for i in ds.history(u)["item_id"].astype(str)]
    assert not [t for t in seen if t in text]  # no history title, verbatim
    with ResultsStore(tmp_path / "store.sqlite") as store:
        rows = [r["result"] for r in store.rows()]
    extractions = [x for x in rows if "complete" in x]
    screen = TitleScreen(seen)
    naming = [x for x in extractions if screen.names_title(x["text"])]
    assert n.left_out == len(naming) and n.results == len(rows) - len(naming)
    fresh = tmp_path / "fresh"
    import_portable(tmp_path / "ck.gz", fresh / "store.sqlite")
    resumed = run_gist(cfg, "ml-100k", fresh, llms=llms, progress=False)
    assert resumed["cost"]["extraction"]["asked_now"] == len(naming)
    if not naming:  # every answer travelled: nothing is asked and the scores are the same
        assert resumed["cost"]["judge"]["asked_now"] == 0
        assert resumed["scores"] == first["scores"]


def test_an_extraction_answer_naming_a_history_title_stays_behind():
    form = _title_free_extraction(TitleScreen(["Heat (1995)", "Godfather, The (1972)"]))
    clean = [{"interest": "Crime thrillers", "ids": ["1", "2"]}]
    answer = {"value": clean, "text": '[{"interest": "Crime thrillers", "ids": ["1", "2"]}]'}
    assert form(answer | {"complete": True}) == answer | {"complete": True}
    named = [{"interest": "Godfather style sagas", "ids": ["2"]}]
    assert form({"value": named, "text": "", "complete": True}) is None
    cut = '[{"interest": "Crime thrillers", "ids": ["1"]}, {"interest": "Heat and'
    assert form({"value": None, "text": cut, "complete": False}) is None  # cut-off phrase too
    # History positions are cited, never titles: digits in id lists are not screened.
    numbers = _title_free_extraction(TitleScreen(["1984"]))
    ok = {"value": None, "text": '[{"interest": "Dystopian novels", "ids": ["1984"', "complete": 0}
    assert numbers(ok) == ok


def test_gist_score_cli_on_records(tmp_path):
    recs = [
        rec("u", "a", 1, True, 2, 4),
        rec("u", "a", 1, False, 1, 2),
        rec("u", "b", 2, True, 3, 3),
    ]
    path = tmp_path / "i.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    oracle = tmp_path / "o.json"
    oracle.write_text(json.dumps({"oracle": {"u": [1, 2, 3]}}))
    cmd = ["gist", "score", "--interests", str(path)]
    r = run_cli(*cmd, "--oracle", str(oracle), "--json")
    assert r.code == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["a"]["ig_p"] == pytest.approx(0.5)
    assert s["a"]["ig_r"] == pytest.approx(0.5 / 3)
    assert s["b"]["is"] == pytest.approx(1.0)
    assert s["a"]["ci"]["ig_p"] == {"lo": 0.5, "hi": 0.5}  # one user: nothing to resample
    path.write_text('{"user_id": "u"}\nnot json\n')
    bad = run_cli(*cmd)
    assert bad.code == 2 and "line 2" in bad.stderr


def _profile_line(user, interests):
    return (
        json.dumps(
            {"user_id": user, "interests": [{"name": n, "object_ids": ids} for n, ids in interests]}
        )
        + "\n"
    )


def test_profiles_rules_are_counted_and_bad_lines_named(ml100k, tmp_path):
    h = ml100k.history("1")["item_id"].astype(str).tolist()
    p = tmp_path / "mine.jsonl"
    p.write_text(
        _profile_line("1", [("war movies", [h[0], h[1], "99999"]), ("War  Movies", [h[2]])])
        + _profile_line("nobody", [("anything", [h[0]])])
    )
    interests, check = read_profiles(p, ml100k)
    assert [(i.model, i.interest, i.ids) for i in interests] == [
        ("mine", "war movies", [h[0], h[1], h[2]])
    ]
    assert (check.profiles, check.unknown_users, check.outside_history, check.merged) == (
        2,
        1,
        1,
        1,
    )
    assert "'99999'" in check.examples["outside_history"][0]
    bad = [
        ('{"user_id": "1", "interests": {}}\n', "interests"),
        ('{"interests": []}\n', "user_id"),
        ('{"user_id": "1", "interests": [{"object_ids": []}]}\n', "interests"),
    ]
    for text, field in bad:
        p.write_text(text)
        with pytest.raises(DataError) as e:
            read_profiles(p, ml100k)
        assert "mine.jsonl, row 1" in str(e.value) and field in str(e.value)


@pytest.mark.e2e
def test_verify_profiles_writes_the_records_gist_score_reads(smollm, ml100k, tmp_path):
    h = ml100k.history("1")["item_id"].astype(str).tolist()
    a, b = tmp_path / "sys_a.jsonl", tmp_path / "sys_b.jsonl"
    a.write_text(_profile_line("1", [("classic films", h[:3]), ("science fiction", h[3:5])]))
    b.write_text(_profile_line("1", [("comedy movies", h[5:8])]))
    cfg = GistConfig(judge="smollm2-135m", options=6, pool_size=60, taxonomy="off")
    r = verify_profiles(
        cfg, "ml-100k", [a, b], tmp_path / "out", llms={"smollm2-135m": smollm}, progress=False
    )
    lines = [json.loads(x) for x in (tmp_path / "out/interests.jsonl").read_text().splitlines()]
    assert sorted(x["model"] for x in lines) == ["sys_a", "sys_a", "sys_b"]
    for x in lines:
        assert set(x["surviving"]) <= set(x["cited"]) <= set(h)
        assert x["verified"] == Predicate().check(x["counts"])[0]
        if x["backing"]:
            assert x["backing"] + x["distractors"] == 6
    oracle = json.loads((tmp_path / "out/oracle.json").read_text())["oracle"]
    assert gist_scores(lines, oracle, ["1"]) == r["scores"]
    assert set(r["scores"]) == {"sys_a", "sys_b"}
    assert list(r["differences"]) == ["sys_a minus sys_b"]
    report = (tmp_path / "out/report.md").read_text()
    assert "- sys_a minus sys_b: IG_P " in report
    assert "prompt's example" not in report  # no prompt of ours wrote these profiles


def test_distractor_candidates_exclude_the_users_whole_history():
    history = [f"old{i}" for i in range(300)] + ["recent"]  # far beyond one chunk of 100
    ds = SimpleNamespace(history=lambda u: pd.DataFrame({"item_id": history}))
    run = SimpleNamespace(config=GistConfig(options=10), ds=ds)
    pool = history[::7] + [f"other{i}" for i in range(40)]
    rec_ = {"user_id": "u", "model": "m", "interest": "x", "cited": ["recent", "old5", "old9"]}
    (job,) = _spec_jobs(run, [rec_], pool)
    assert set(job.evidence) <= set(rec_["cited"])
    assert job.candidates and not set(job.candidates) & set(history)
    assert sorted(job.candidates) == sorted(f"other{i}" for i in range(40))


def test_users_naming_the_same_interest_share_the_distractor_order():
    """The judge's (interest, object) verdicts are stored per pair, so two users (or models)
    with the same interest examine the pool in the same order (each without its own items),
    and a different interest in another."""
    own = {"a": ["p0", "p3", "p8"], "b": ["p1", "p3", "p20"]}
    ds = SimpleNamespace(history=lambda u: pd.DataFrame({"item_id": own[u]}))
    run = SimpleNamespace(config=GistConfig(options=10), ds=ds)
    pool = [f"p{i}" for i in range(60)]

    def rec_(user, model, interest):
        return {"user_id": user, "model": model, "interest": interest, "cited": own[user][:2]}

    ja, jb, jc = _spec_jobs(
        run,
        [rec_("a", "m1", "war films"), rec_("b", "m2", "war films"), rec_("a", "m1", "x")],
        pool,
    )
    drop = set(own["a"]) | set(own["b"])
    assert [i for i in ja.candidates if i not in drop] == [
        i for i in jb.candidates if i not in drop
    ]
    assert ja.candidates != jc.candidates and sorted(ja.candidates) == sorted(jc.candidates)


def test_a_missing_model_fails_before_any_work(tmp_path, smollm):
    """The second model under test is missing: the run stops before it loads data, asks the
    first model anything or opens a store (not after the first model's hours of answers)."""
    gone = str(tmp_path / "gone.gguf")
    cfg = GistConfig(models=("smollm2-135m", gone), judge="smollm2-135m", users=2)
    with pytest.raises(FileNotFoundError, match="gone.gguf"):
        run_gist(cfg, "ml-100k", tmp_path / "out", llms={"smollm2-135m": smollm}, progress=False)
    assert not (tmp_path / "out").exists()


def test_the_full_taxonomy_scores_whole_names_where_the_engine_allows(smollm):
    assert taxonomy_rule(smollm) == "likelihood"
    # vLLM constrains in its own engine and scores no whole option: decoded token by token.
    vllm_like = SimpleNamespace(capabilities=ENGINE_CAPABILITIES, model=smollm.model)
    assert taxonomy_rule(vllm_like) == "greedy"
    with pytest.raises(BackendError, match="declares no `capabilities`"):
        taxonomy_rule(SimpleNamespace())


@pytest.mark.e2e
def test_a_deterministic_run_repeats_an_answer_asked_again_in_another_batch(
    smollm, ml100k, tmp_path, monkeypatch
):
    """The case a resumed run on a new machine hits: answers that did not travel with the
    checkpoint are asked again, in a batch of other questions than the first time. With
    ``deterministic`` the re-asked answer is bit-identical (the same text, the same key),
    and every decode (extraction, evidence filter, specificity) ran on the invariant engine.

    What SmolLM2 extracts differs by dtype and CPU (in bf16 it can write no usable interest,
    and the run then never reaches the evidence filter), so the parsed interests are topped up
    with one that cites the user's most recent item: the extraction still decodes and stores
    the model's own answers, and the filter always has a question to ask."""
    one_cited_interest(monkeypatch)

    seen = []
    for name in ("decode_prompts", "decode_shared"):
        real = getattr(_fast, name)

        def spy(*a, _real=real, _name=name, **kw):
            seen.append((_name, a[-1].deterministic))
            return _real(*a, **kw)

        # where decoding calls the engines (``decoding._decode`` imports them at its top)
        monkeypatch.setattr(decode_module, name, spy)

    # Two chunks of 5 decoded two rows a step (the invariant engine's fixed row count), one
    # interest citing at most 3 items, short answers: the work stays small whatever the
    # model writes; the property needs two chunks in one batch, not size.
    cfg = GistConfig(
        models=("smollm2-135m",),
        judge="smollm2-135m",
        users=1,
        max_history=10,
        chunk_size=5,
        max_interests=1,
        max_ids=3,
        extraction_tokens=24,
        batch_size=2,
        options=4,
        pool_size=10,
        taxonomy="off",
        deterministic=True,
    )
    llms = {"smollm2-135m": smollm}
    run_gist(cfg, "ml-100k", tmp_path, llms=llms, progress=False)
    assert {n for n, _ in seen} == {"decode_prompts", "decode_shared"}
    assert all(flag is True for _, flag in seen), seen
    db = sqlite3.connect(tmp_path / "store.sqlite")
    rows = [
        (k, res)
        for k, req, res in db.execute("SELECT key, request, result FROM results ORDER BY key")
        if json.loads(req).get("kind") == "extract"
    ]
    assert len(rows) == 2  # two chunks of 5, asked as one batch
    key, first = rows[1]
    db.execute("DELETE FROM results WHERE key = ?", (key,))
    db.commit()
    db.close()
    again = run_gist(cfg, "ml-100k", tmp_path, llms=llms, progress=False)
    assert again["cost"]["extraction"]["asked_now"] == 1  # alone in its batch this time
    db = sqlite3.connect(tmp_path / "store.sqlite")
    (second,) = db.execute("SELECT result FROM results WHERE key = ?", (key,)).fetchone()
    db.close()
    assert second == first


def test_deterministic_is_refused_for_a_vllm_model_by_name(tmp_path):
    """A ready backend that batches in its own engine cannot give bit-identical answers: both
    entry points refuse it by name before they load data or open a store."""
    vllm_like = SimpleNamespace(capabilities=ENGINE_CAPABILITIES)
    local = SimpleNamespace(capabilities=Capabilities())
    cfg = GistConfig(models=("m",), judge="j", deterministic=True)
    with pytest.raises(UserFacingError, match="j runs in its own engine"):
        run_gist(cfg, "ml-100k", tmp_path / "out", llms={"m": local, "j": vllm_like})
    assert not (tmp_path / "out").exists()
    with pytest.raises(UserFacingError, match="j runs in its own engine"):
        verify_profiles(
            cfg, "ml-100k", [tmp_path / "p.jsonl"], tmp_path / "v", llms={"j": vllm_like}
        )
    assert not (tmp_path / "v").exists()
    # Without ``deterministic`` the same backend is accepted (the run then fails later, on
    # the profile file that does not exist: past the check).
    with pytest.raises(DataError, match="p.jsonl: cannot read it"):
        verify_profiles(
            cfg.model_copy(update={"deterministic": False}),
            "ml-100k",
            [tmp_path / "p.jsonl"],
            tmp_path / "v",
            llms={"j": vllm_like},
        )
