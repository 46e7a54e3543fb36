"""Issue 89, items 4 and 7: weight diagnostics beside the weighted estimates, and gold that
does not match the runs, k or row count it was drawn for."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from recjudge.data import DataError
from recjudge.evaluators import RecRun, RunCheck, listed_pairs, sample_gold
from recjudge.evaluators._circular import circular_systems, lenient_systems
from recjudge.evaluators.offline._evaluation import weight_diagnostics
from recjudge.evaluators.offline._gold import check_redraw, read_gold, write_gold
from recjudge.evaluators.offline._impute import judge_record
from recjudge.evaluators.offline._propensities import Propensities, fit_propensities
from recjudge.reward import JudgeConfig


def _run(name, lists):
    return RecRun(name, f"{name}.jsonl", lists, {}, RunCheck())


LISTS = {f"u{u}": [f"i{(u * 3 + r) % 40}" for r in range(5)] for u in range(30)}


def test_weights_carried_by_one_pair_are_fragile_and_even_ones_stable():
    run = _run("a", LISTS)
    users = sorted(LISTS)
    # every user logged their whole list, one relevant pair per user
    logged = {u: {i: int(r == 0) for r, i in enumerate(LISTS[u])} for u in users}
    even = Propensities("file", "even", {f"i{j}": 0.5 for j in range(40)})
    got = weight_diagnostics([run], logged, even, users, 5)["a"]
    assert got["ess"] == pytest.approx(150)  # equal weights: every logged pair counts
    assert got["verdict"] == "stable"
    # one item seen at a propensity 1,000x below the others carries the estimate
    skewed = Propensities("file", "skewed", {**even.per_item, LISTS["u0"][0]: 0.0005},
                          clip=1e-6)  # fmt: skip
    got = weight_diagnostics([run], logged, skewed, users, 5)["a"]
    assert got["ess"] < 5 and got["top1_share"] > 0.9
    assert got["verdict"] == "fragile"


def _gold_file(tmp_path, runs, n=20, k=5, design="uniform"):
    users = sorted(LISTS)
    rows = sample_gold(runs, users, k, n, design=design, seed=1)
    path = tmp_path / "gold.csv"
    write_gold(rows, path, {"design": design, "seed": 1, "k": k, "n": n,
                            "runs": {r.name: r.path for r in runs}})  # fmt: skip
    text = path.read_text().splitlines()
    path.write_text("\n".join([text[0]] + [line.replace(",,", ",1,", 1) for line in text[1:]])
                    + "\n")  # fmt: skip
    return path, users


def test_gold_with_deleted_rows_is_refused_against_its_design_record(tmp_path):
    a = _run("a", LISTS)
    path, users = _gold_file(tmp_path, [a])
    listed = set(listed_pairs([a], users, 5))
    assert len(read_gold(path, users, listed, ["a"], 5)) == 20
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:11]) + "\n")  # 10 of the 20 rows deleted
    with pytest.raises(DataError, match="10 labelled pairs but its design record drew 20"):
        read_gold(path, users, listed, ["a"], 5)


def test_gold_drawn_for_other_runs_or_another_k_is_refused(tmp_path):
    a = _run("a", LISTS)
    b = _run("b", {u: v[::-1] for u, v in LISTS.items()})
    path, users = _gold_file(tmp_path, [a])
    listed = set(listed_pairs([a, b], users, 5))
    with pytest.raises(DataError, match=r"drawn from the lists of \['a'\]"):
        read_gold(path, users, listed, ["a", "b"], 5)
    with pytest.raises(DataError, match="top-5 lists but evaluate's metrics reach top-10"):
        read_gold(path, users, set(listed_pairs([a], users, 10)), ["a"], 10)


def test_propensities_fitted_on_few_users_say_so_and_carry_a_standard_error():
    g = np.random.default_rng(0)
    items = [f"i{j}" for j in range(300)]
    pop = {i: int(g.integers(1, 500)) for i in items}

    def log(n_users):
        return {f"u{u}": {i: 1 for i in items if g.random() < min(1, 0.002 * (pop[i] + 1) ** 0.8)}
                for u in range(n_users)}  # fmt: skip

    few, many = fit_propensities(log(5), pop), fit_propensities(log(200), pop)
    assert few.fit["few_users"] and "fitted on only 5 users" in few.describe
    assert not many.fit["few_users"] and "fitted on only" not in many.describe
    assert 0 < many.fit["exponent_se"] < few.fit["exponent_se"]
    assert abs(many.fit["exponent"] - 0.8) < 4 * many.fit["exponent_se"]


def test_a_judge_without_an_llm_records_no_model():
    assert judge_record(JudgeConfig(mode="cf-only"))["model"] is None
    assert judge_record(JudgeConfig(mode="brief"))["model"] == JudgeConfig().model


def test_a_retrained_twin_of_the_judges_cf_is_circular_whatever_its_seed_or_folder():
    source = {"folder": "/runs/judge-cf", "model": "als", "fingerprint": "abc",
              "dataset": "ml-100k"}  # fmt: skip
    twin = RecRun("als", "als.jsonl", {}, {}, RunCheck(), provenance={
        "model": "als", "model_folder": "/runs/als-seed1", "model_fingerprint": "other",
        "dataset": "ml-100k"})  # fmt: skip
    other_data = RecRun("als_bx", "b.jsonl", {}, {}, RunCheck(), provenance={
        "model": "als", "model_folder": "/x", "model_fingerprint": "y",
        "dataset": "book-crossing"})  # fmt: skip
    pop = RecRun(
        "pop",
        "pop.jsonl",
        {},
        {},
        RunCheck(),
        provenance={
            "model": "pop",
            "model_folder": "/p",
            "model_fingerprint": "z",
            "dataset": "ml-100k",
        },
    )
    found = circular_systems(source, [twin, other_data, pop])
    assert list(found) == ["als"] and "retrained twin" in found["als"]


def test_a_system_the_judge_favours_far_beyond_its_log_is_lenient():
    def row(yes, hit):
        return {"judge_yes_rate": yes, "logged_hit_rate": hit}

    found = lenient_systems({"als": row(0.977, 0.30), "pop": row(0.40, 0.28),
                             "knn": row(0.38, 0.25)})  # fmt: skip
    assert list(found) == ["als"] and "97.7" not in found["als"] and "98%" in found["als"]
    assert lenient_systems({"a": row(0.5, 0.3), "b": row(0.45, 0.25), "c": row(0.6, 0.35)}) == {}


def test_gold_drawn_among_other_evaluation_users_is_refused(tmp_path):
    """Gold drawn from an impute of 20 users, read by an evaluation of 30 (impute resumed with
    a larger --users): the pairs of the 10 others could never be drawn (issue 109)."""
    a = _run("a", LISTS)
    users = sorted(LISTS)
    some = users[:20]
    rows = sample_gold([a], some, 5, 20, design="uniform", seed=1)
    path = tmp_path / "gold.csv"
    write_gold(rows, path, {"design": "uniform", "seed": 1, "k": 5, "n": 20,
                            "runs": {"a": a.path}, "evaluation_users": len(some)})  # fmt: skip
    text = path.read_text().splitlines()
    path.write_text("\n".join([text[0]] + [line.replace(",,", ",1,", 1) for line in text[1:]])
                    + "\n")  # fmt: skip
    listed = set(listed_pairs([a], users, 5))
    assert len(read_gold(path, some, set(listed_pairs([a], some, 5)), ["a"], 5)) == 20
    with pytest.raises(DataError, match="drawn among 20 evaluation users but evaluate has 30"):
        read_gold(path, users, listed, ["a"], 5)


@pytest.mark.parametrize("design", ["uniform", "active"])
def test_an_edited_inclusion_probability_is_refused_against_the_redraw(tmp_path, design):
    """Issue 111: an active gold file whose inclusion_prob column was set to 1 everywhere
    was weighed by the edited column; the redraw from its design record names the row."""
    a = _run("a", LISTS)
    users = sorted(LISTS)
    g = np.random.default_rng(0)
    judged = {pair: (float(g.random()), False) for pair in listed_pairs([a], users, 5)}
    rows = sample_gold([a], users, 5, 30, design=design, seed=2, judged=judged)
    path = tmp_path / "gold.csv"
    write_gold(rows, path, {"design": design, "seed": 2, "k": 5, "n": 30, "runs": {"a": a.path},
                            "evaluation_users": len(users)})  # fmt: skip
    text = path.read_text().splitlines()
    path.write_text("\n".join([text[0]] + [line.replace(",,", ",1,", 1) for line in text[1:]])
                    + "\n")  # fmt: skip
    listed = set(listed_pairs([a], users, 5))
    gold = read_gold(path, users, listed, ["a"], 5)
    check_redraw(path, gold, [a], users, judged)  # as drawn: accepted
    df = pd.read_csv(path, dtype=str, keep_default_na=False)
    df["inclusion_prob"] = "1.0"
    df.to_csv(path, index=False)
    edited = read_gold(path, users, listed, ["a"], 5)
    with pytest.raises(DataError, match=r"inclusion_prob 1\.0 of pair .* is not what its "
                       r"design drew") as err:  # fmt: skip
        check_redraw(path, edited, [a], users, judged)
    assert err.value.row == 1 and err.value.field == "inclusion_prob"
