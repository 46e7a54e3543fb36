"""Every prompt family's text is pinned to its version: stored answers are keyed by the
version, so a prompt whose text changes while its version does not would let a store hand
back answers to a question that was never asked. Each family is rendered on fixed inputs (the
simulators on a fixed population, with each of their trait tiers' wordings) and its
fingerprint compared with the one recorded beside the version."""

from __future__ import annotations

import pytest

from recjudge._util import stable_hash
from recjudge.evaluators.arena import _prompts as a
from recjudge.evaluators.gist import _gist as g
from recjudge.evaluators.usersum import _prompts as u
from recjudge.reward import HistoryItem
from recjudge.reward import _simulators as s
from recjudge.reward._prompt import build_messages


def _brief():
    h = [HistoryItem("i1", "Up (2009)", "Up (2009) | Animation", 4.0),
         HistoryItem("i2", "Fargo (1996)", "Fargo (1996) | Crime", None)]  # fmt: skip
    out = []
    for domain in ("movies", "books", "generic"):
        for evidence in (True, False):
            r = build_messages(h, "Heat (1995) | Crime", domain=domain, evidence=evidence,
                               rating_scale=5.0)  # fmt: skip
            out.append(r.messages)
    return out


def _usersum():
    acts = [{"text": "Up (2009)", "rating": 4.0}, {"text": "Fargo (1996)", "rating": float("nan")}]
    return [
        u.summary_messages(acts, "Summarise the user", 50),
        u.summary_messages(acts, "Summarise the user", 50, "2000-2001"),
        u.regenerate_messages(acts, "Summarise", 50, "2000", "old summary", ["q1"]),
        u.combine_messages(["a", "b"], ["2000", "2001"], "Summarise", 50),
        u.query_check_messages("summary", "What genres?"),
        u.qg_messages("summary", 3),
        u.qa_messages(acts, "Q?", "A."),
        u.predict_messages("summary", ["x", "y"], "movie", acts),
        u.predict_messages("summary", ["x", "y"], "rating", None),
    ]


def _arena():
    return [
        a.arena_messages("a 25-year-old", ["Up"], ["A1", "A2"], ["B1", "B2"], 150, "movies", True),
        a.arena_messages("", ["Up"], ["A1"], ["B1"], 80, "books", False),
        a.absolute_messages("a 25-year-old", ["Up"], ["A1", "A2"], "movies"),
    ]


def _gist():
    cfg = g.GistConfig()
    return [
        g.extraction_messages(["[1] implicit_positive - Up (2009)"], "movies", cfg),
        g.relevance_messages("1990s crime thrillers", "movies"),
        g.specificity_messages("1990s crime thrillers", ["Heat", "Up", "Fargo"], 2, "movies"),
        g.taxonomy_messages("1990s crime thrillers", ["Art", "Crime"]),
        g.taxonomy_full_messages(["Art", "Crime"]),
    ]


def _simulators():
    h = [HistoryItem("i1", "Up (2009)", "Up (2009) | Animation", 4.0),
         HistoryItem("i2", "Fargo (1996)", "Fargo (1996) | Crime", None),
         HistoryItem("i3", "Heat (1995)", "Heat (1995) | Crime", float("nan"))]  # fmt: skip
    # cut points that put this history's activity, conformity and diversity all in tier 1,
    # all in tier 2, all in tier 3: every trait wording goes through the prompt
    pops = [s.Population({"i1": ["Animation"], "i2": ["Crime"], "i3": ["Crime", "Drama"]},
                         {"i1": 3.5, "i2": 4.0, "i3": 2.0},
                         {"u1": {"gender": "F", "age": 25, "zip_code": "0", "job": float("nan")}},
                         cuts, cuts, cuts)
            for cuts in ((100.0, 200.0), (-1.0, 100.0), (-1.0, -1.0))]  # fmt: skip
    assert [p.traits(h) for p in pops] == [dict.fromkeys(("activity", "conformity",
                                           "diversity"), t) for t in (1, 2, 3)]  # fmt: skip
    out: list = []
    for name, cls in s.SIMULATORS.items():
        sim = cls()
        for user, who in [("u2", pops[0]), ("u1", None)] + [("u1", p) for p in pops]:
            if who is None and sim.needs_population:
                continue
            out += [name, sim.question, sim.profile_messages(user, h, who, 2),
                    sim.system("I like crime films.", user, h, who)]  # fmt: skip
    return out + [repr(getattr(s, n)) for n in sorted(dir(s)) if n.startswith("_") and n.isupper()]


FAMILIES = {
    "brief": (_brief, "recjudge.reward._prompt", "PROMPT_VERSION", "PROMPT_FINGERPRINT"),
    "usersum": (_usersum, "recjudge.evaluators.usersum._prompts", "USERSUM_PROMPT_VERSION",
                "USERSUM_PROMPT_FINGERPRINT"),
    "arena": (_arena, "recjudge.evaluators.arena._prompts", "ARENA_PROMPT_VERSION",
              "ARENA_PROMPT_FINGERPRINT"),
    "gist": (_gist, "recjudge.evaluators.gist._prompts", "GIST_PROMPT_VERSION",
             "GIST_PROMPT_FINGERPRINT"),
    "simulators": (_simulators, "recjudge.reward._simulators", "SIMULATOR_VERSION",
                   "SIMULATOR_FINGERPRINT"),
}  # fmt: skip


def fingerprint(family: str) -> str:
    render, module, version, _ = FAMILIES[family]
    mod = __import__(module, fromlist=["x"])
    return f"{getattr(mod, version)}:{stable_hash(render(), length=16)}"


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_prompt_text_change_comes_with_a_new_version(family):
    _, module, version, recorded_name = FAMILIES[family]
    mod = __import__(module, fromlist=["x"])
    got, recorded = fingerprint(family), getattr(mod, recorded_name)
    assert got == recorded, (
        f"{family} prompts render differently from {recorded_name} = {recorded!r}. If the text "
        f"changed on purpose, bump {version} (stored answers are keyed by it) and set "
        f"{recorded_name} = {got!r}; the version is part of the fingerprint, so a new "
        "fingerprint under the old version is always this error"
    )
