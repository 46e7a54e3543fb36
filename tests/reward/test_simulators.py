"""The user-simulator baselines (PUB, Agent4Rec, RecAgent): Agent4Rec's trait statistics by
hand, and each simulator as a judge mode on the real model."""

from __future__ import annotations

import gzip
import json
import re

import numpy as np
import pandas as pd
import pytest

from recjudge.data import Dataset, TitleScreen
from recjudge.reward import (
    HistoryItem,
    Judge,
    JudgeConfig,
    Population,
    ResultsStore,
    diversity_count,
    export_portable,
    import_portable,
    requests_for,
)
from recjudge.reward._simulators import SIMULATORS, title_free_persona


def test_diversity_counts_top_genres_up_to_80_percent_as_agent4rec():
    assert diversity_count([["A"]] * 8 + [["B"], ["C"]]) == 1  # 0.8 reaches the limit
    assert diversity_count([["A"], ["B"]] * 5) == 1  # 0.5, then 1.0 > 0.8
    assert diversity_count([["A", "B"], ["C"], ["D"], ["E"]]) == 4  # 5 x 0.2
    assert diversity_count([["A"]] * 9 + [["B"]]) == 0  # the top genre alone is 0.9
    assert diversity_count([[]]) == 0


def _world() -> Dataset:
    """Four users with 2, 3, 4 and 8 ratings, ever further from the items' means."""
    rows, t = [], 0.0
    means = {f"i{j}": 3.0 for j in range(8)}
    plan = {"u0": 2, "u1": 3, "u2": 4, "u3": 8}
    for u, n in plan.items():
        for j in range(n):
            gap = 0.0 if u == "u0" else (2.0 if u == "u3" else 1.0) * (-1) ** j
            rows.append((u, f"i{j}", t, means[f"i{j}"] + gap))
            t += 1
    inter = pd.DataFrame(rows, columns=["user_id", "item_id", "timestamp", "rating"])
    items = pd.DataFrame(
        {"item_id": [f"i{j}" for j in range(8)], "title": [f"T{j}" for j in range(8)],
         "genres": ["A|B" if j % 2 else "C" for j in range(8)]}
    )  # fmt: skip
    users = pd.DataFrame({"user_id": list(plan), "gender": ["F", "M", "F", "M"]})
    return Dataset("w", inter, items, users)


def test_traits_are_agent4recs_tiers_over_the_population():
    ds = _world()
    pop = Population.of(ds)
    counts = np.array([2, 3, 4, 8], float)
    assert pop.activity_cuts == pytest.approx(tuple(np.percentile(counts, [60, 90])))
    inter = ds.interactions
    mean = inter.groupby("item_id")["rating"].mean()
    gap = (inter["rating"] - inter["item_id"].map(mean)) ** 2
    conf = gap.groupby(inter["user_id"]).mean().to_numpy()
    assert pop.conformity_cuts == pytest.approx(tuple(np.percentile(conf, [25, 80])))

    def hist(u):
        h = inter[inter.user_id == u]
        return [HistoryItem(i, i, i, r) for i, r in zip(h.item_id, h.rating, strict=True)]

    lo, hi = pop.traits(hist("u0")), pop.traits(hist("u3"))
    assert lo["activity"] == 1 and hi["activity"] == 3
    p25, p80 = np.percentile(conf, [25, 80])
    for k, u in enumerate(("u0", "u1", "u2", "u3")):
        want = 1 if conf[k] < p25 else 2 if conf[k] < p80 else 3
        assert pop.traits(hist(u))["conformity"] == want
    # the held-out part can be kept out: item means from the given interactions only
    only = Population.of(ds, inter[inter.user_id != "u3"])
    assert "i7" not in only.item_mean and only.item_mean["i0"] != pop.item_mean["i0"]


@pytest.mark.parametrize("mode", ["pub", "agent4rec", "recagent"])
def test_simulator_mode_plays_its_persona_and_stores_it_apart(mode, smollm, ml100k, tmp_path):
    pop = Population.of(ml100k)
    reqs = requests_for(ml100k, [("1", "50"), ("1", "100"), ("2", "50")])
    cfg = JudgeConfig(mode=mode, max_history=5, persona_tokens=12)
    judge = Judge(cfg, llm=smollm, population=pop)
    with ResultsStore(tmp_path / "s.sqlite") as store:
        out = judge.judge_many(reqs, store=store)
        assert len(store.get_many([j.key for j in out])) == 3  # only judgments in the store
    for j in out:
        assert j.error is None and j.evidence == [] and j.delta == 0.0 and j.sigma is None
        assert j.raw_text in ('{"is_relevant": "YES"}', '{"is_relevant": "NO"}')
    persona = judge.persona(reqs[0])
    assert persona and persona in judge.prompt_text(reqs[0])
    assert judge.persona(reqs[1]) == persona  # one persona per user history
    # A rerun with a fresh judge reads personas and judgments back: no generation at all.
    again = Judge(cfg, llm=smollm, population=pop)
    calls = []
    real = smollm.generate
    smollm.generate = lambda *a, **k: calls.append(1) or real(*a, **k)
    try:
        with ResultsStore(tmp_path / "s.sqlite") as store:
            back = again.judge_many(reqs, store=store)
    finally:
        smollm.generate = real
    assert not calls and [b.key for b in back] == [j.key for j in out]
    assert (tmp_path / "s.sqlite.personas").exists()

    # A checkpoint carries the personas that name no title of their user's history (and the
    # YES/NO judgments); a fresh store resumed from it writes only the others again.
    n = export_portable(tmp_path / "s.sqlite", tmp_path / "ck.gz")
    with ResultsStore(tmp_path / "s.sqlite.personas") as personas:
        written = len(list(personas.rows()))  # one per distinct (user, history)
    assert n.results == 3 and n.personas + n.left_out == written
    rows = gzip.decompress((tmp_path / "ck.gz").read_bytes()).decode().splitlines()[1:]
    carried = [json.loads(x)["result"]["text"].lower() for x in rows if '"personas"' in x]
    assert len(carried) == n.personas
    for r in reqs:  # a title shown to the model is in no carried persona (with or without year)
        for title in {h.title.lower() for h in r.history}:
            bare = re.sub(r"\s*\(\d{4}\)$", "", title)
            assert not [p for p in carried if title in p or (len(bare) > 5 and bare in p)]
    fresh = tmp_path / "fresh" / "s.sqlite"
    got = import_portable(tmp_path / "ck.gz", fresh)
    assert (got.results, got.personas) == (3, n.personas)
    prompts: list[str] = []
    smollm.generate = lambda p, *a, **k: prompts.extend(p) or real(p, *a, **k)
    try:
        with ResultsStore(fresh) as store:
            resumed = Judge(cfg, llm=smollm, population=pop)
            assert [b.key for b in resumed.judge_many(reqs, store=store)] == [j.key for j in out]
    finally:
        smollm.generate = real
    assert len(prompts) == n.left_out  # only the personas left out were written again


def test_a_persona_is_portable_only_if_it_names_no_title_of_its_history():
    form = title_free_persona(TitleScreen(["Heat (1995)", "Godfather, The (1972)", "x1"]))
    calm = "Calm and curious; likes crime dramas and slow thrillers."
    assert form({"text": calm}) == {"text": calm}
    assert form({"text": "Loves The Godfather and its sequels."}) is None  # article moved
    assert form({"text": "a fan of HEAT."}) is None  # any case, year dropped
    assert form({"text": "rated item x1 highly"}) is None  # an item id with letters
    assert form({"text": None}) is None and form({}) is None


@pytest.mark.parametrize("name", ["pub", "agent4rec", "recagent"])
def test_a_persona_prompt_carries_titles_verbatim_braces_included(name):
    """The persona task is a template filled with the history; a title that looks like a
    template field is text, not a field (and the most recent ``limit`` items are shown)."""
    odd = "{history} {0} {user_id!r}"
    h = [HistoryItem("a", "Old", "Old (1950)", 3.0), HistoryItem("b", odd, odd, None)]
    system, user = SIMULATORS.get(name)().profile_messages("u1", h, None, 1)
    assert system["role"] == "system" and system["content"] and user["role"] == "user"
    assert f"- {odd}\n" in user["content"] and "Old (1950)" not in user["content"]


def test_simulators_that_read_the_dataset_ask_for_it():
    with pytest.raises(ValueError, match="population=Population.of"):
        Judge(JudgeConfig(mode="agent4rec"), llm=object())
    Judge(JudgeConfig(mode="pub"), llm=object())  # PUB reads only the history


def test_persona_tokens_never_change_a_key_outside_the_simulators(ml100k):
    """A setting that cannot change a brief/zero-shot answer must not orphan stored results."""
    req = requests_for(ml100k, [("1", "50")])[0]
    for mode in ("brief", "zero-shot"):
        a = Judge(JudgeConfig(mode=mode), llm=None).key(req)
        assert Judge(JudgeConfig(mode=mode, persona_tokens=9), llm=None).key(req) == a
