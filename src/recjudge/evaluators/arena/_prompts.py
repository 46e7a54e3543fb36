"""RecSys Arena prompts: the user's profile, the six aspects as the paper defines them, the
pairwise and the absolute question.

The aspect definitions follow RecSys Arena (Wu et al., 2024, Sec. 3 and its prompt): the
judge role-plays the user, reads both lists, analyses each aspect, then gives one verdict per
aspect and an overall verdict.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from recjudge._util import chat
from recjudge.evaluators.arena._metrics import ASPECTS

ARENA_PROMPT_VERSION = "arena-v2"
ARENA_PROMPT_FINGERPRINT = "arena-v2:0e19596e630a397c"  # tests/test_prompt_versions.py
ABSOLUTE = ("awful", "poor", "fair", "good", "excellent")  # distinct first letters
ABSOLUTE_SCORE = dict(zip(ABSOLUTE, (0.0, 0.25, 0.5, 0.75, 1.0), strict=True))

# The paper's definitions, phrased as the user's statements they are there.
ASPECT_DEFINITIONS = {
    "accuracy": "the list matches my interests",
    "satisfaction": "I am satisfied with the list",
    "inspiration": "the {word} in the list provoke my thoughts, spark my curiosity and make "
    "me want to explore further",
    "content_quality": "the recommended {word} are of high quality",
    "transparency": "it is clear which of my details or past {word} each recommendation "
    "relates to (explainability)",
    "impact": "the list has a positive impact on me",
}
assert tuple(ASPECT_DEFINITIONS) == ASPECTS

ML_AGE = {
    1: "under 18",
    18: "18-24",
    25: "25-34",
    35: "35-44",
    45: "45-49",
    50: "50-55",
    56: "56 or older",
}
ML_OCCUPATION = [
    "other",
    "academic/educator",
    "artist",
    "clerical/admin",
    "college/grad student",
    "customer service",
    "doctor/health care",
    "executive/managerial",
    "farmer",
    "homemaker",
    "K-12 student",
    "lawyer",
    "programmer",
    "retired",
    "sales/marketing",
    "scientist",
    "self-employed",
    "technician/engineer",
    "tradesman/craftsman",
    "unemployed",
    "writer",
]


def user_profile(ds: Any, user_id: str) -> str:
    row = ds.user_row(user_id)
    if row is None:
        return ""
    parts = []
    age = row.get("age")
    if age is not None and age == age:
        parts.append(
            f"age {ML_AGE.get(int(age), int(age))}" if ds.name == "ml-1m" else f"age {int(age)}"
        )
    if row.get("gender") in ("M", "F"):
        parts.append("male" if row["gender"] == "M" else "female")
    occ = row.get("occupation")
    if occ is not None and occ == occ:
        try:
            parts.append(ML_OCCUPATION[int(float(occ))])
        except (ValueError, IndexError):
            parts.append(str(occ))
    return ", ".join(parts)


def arena_messages(
    profile: str,
    history: Sequence[str],
    list_a: Sequence[str],
    list_b: Sequence[str],
    analysis_chars: int,
    domain: str = "movies",
    per_aspect: bool = True,
) -> list[dict[str, str]]:
    """The pairwise question: the user's profile and recent liked items, lists A and B, the
    six aspects with their definitions, an analysis (one per aspect with ``per_aspect``, as
    the paper asks, or one joint text), then a verdict per aspect and overall."""
    hist = "\n".join(f"- {h}" for h in history)
    la = "\n".join(f"{i + 1}. {x}" for i, x in enumerate(list_a))
    lb = "\n".join(f"{i + 1}. {x}" for i, x in enumerate(list_b))
    who = f"You are a {domain} fan ({profile})." if profile else f"You are a {domain} fan."
    system = (
        f"{who} Recommender systems A and B have each suggested a list of {domain} to you "
        "based on your details and history. Judge them honestly as this user."
    )
    aspects = "\n".join(f"- {a}: {ASPECT_DEFINITIONS[a].format(word=domain)}." for a in ASPECTS)
    if per_aspect:
        analysis = (
            f"First analyse both lists on each aspect (at most {analysis_chars} characters "
            "per aspect)."
        )
        shape = '{"analysis": {"accuracy": "...", ..., "impact": "..."}, '
    else:
        analysis = f"First write a short analysis (at most {analysis_chars} characters)."
        shape = '{"analysis": "...", '
    user = (
        f"{domain.capitalize()} you liked recently, newest first:\n{hist}\n\nList A:\n{la}"
        f"\n\nList B:\n{lb}\n\nCompare the lists on six aspects:\n{aspects}\n\n{analysis} "
        "Then, based on it, say which system is better on each aspect and overall: "
        '"A wins", "B wins" or "Tie". Answer in JSON: '
        + shape
        + '"accuracy": ..., "satisfaction": ..., "inspiration": ..., "content_quality": ..., '
        '"transparency": ..., "impact": ..., "overall": ...}'
    )
    return chat(system, user)


def absolute_messages(
    profile: str, history: Sequence[str], items: Sequence[str], domain: str = "movies"
) -> list[dict[str, str]]:
    hist = "\n".join(f"- {h}" for h in history)
    lst = "\n".join(f"{i + 1}. {x}" for i, x in enumerate(items))
    who = f"You are a {domain} fan ({profile})." if profile else f"You are a {domain} fan."
    return chat(
        f"{who} Rate a recommendation list for yourself.",
        f"Your most recent {domain}, newest first:\n{hist}\n\n"
        f"Recommended list:\n{lst}\n\nHow good is this list for you? Answer in JSON: "
        '{"rating": "awful", "poor", "fair", "good" or "excellent"}',
    )
