"""GISTBench's prompts (versioned: every stored answer is keyed by ``GIST_PROMPT_VERSION``;
``tests/test_prompt_versions.py`` ties the rendered text to ``GIST_PROMPT_FINGERPRINT``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from recjudge._util import chat
from recjudge.reward import SLOT

if TYPE_CHECKING:
    from recjudge.evaluators.gist._config import GistConfig

GIST_PROMPT_VERSION = "gist-v1"
GIST_PROMPT_FINGERPRINT = "gist-v1:39fa69db097acbd3"  # tests/test_prompt_versions.py
EVENT_WORDS = (
    "explicit_positive (rated highly / loved), implicit_positive (engaged or liked), "
    "implicit_negative (skipped or abandoned), explicit_negative (rated low / disliked)"
)


def extraction_messages(
    lines: Sequence[str], domain_word: str, config: GistConfig
) -> list[dict[str, str]]:
    lo, hi = config.words
    return chat(
        "You study a user's activity history and list their specific interests.",
        (
            f"Below are the user's {len(lines)} most recent engagements with {domain_word}, "
            "most recent first. Each line is `[object_id] event_type - object`. Event "
            f"types: {EVENT_WORDS}.\n\n"
            + "\n".join(lines)
            + f"\n\nList the user's specific interests, each {lo} to {hi} words (for "
            f'example "{config.interest_example}", not "{domain_word}"), each citing the '
            "ids of the objects above that show it. Cite each object in at most "
            f"{config.max_citations} interests. {config.predicate.describe()} So cite "
            "enough positive evidence for each interest and do not list things the "
            'user dislikes. Answer as JSON: [{"interest": "...", "ids": ["...", ...]}, ...]'
        ),
    )


def relevance_messages(interest: str, domain_word: str) -> list[dict[str, str]]:
    """Judge prompt with the object in the slot at the very end (shared prefix per interest)."""
    return chat(
        "You check evidence for a person's interests.",
        (
            f'Interest: "{interest}".\nIs the following one of the {domain_word} a clear '
            "example of this interest? Answer YES or NO as JSON.\n"
            f"Object: {SLOT}"
        ),
    )


def specificity_messages(
    interest: str, options: Sequence[str], n: int, domain_word: str
) -> list[dict[str, str]]:
    lines = [f"{i + 1}. {o}" for i, o in enumerate(options)]
    return chat(
        "You match interests to the objects that show them.",
        (
            f'A user has the interest "{interest}". Exactly {n} of the following '
            f"{len(options)} {domain_word} come from this user's history as evidence of "
            "that interest; the others are unrelated.\n\n"
            + "\n".join(lines)
            + f"\n\nPick the {n} numbers of the evidence. Answer as JSON: "
            '{"picks": ["<number>", ...]}'
        ),
    )


def taxonomy_messages(interest: str, names: Sequence[str]) -> list[dict[str, str]]:
    return chat(
        "You file interests under a category.",
        (
            f'Interest: "{interest}".\nCategories:\n'
            + "\n".join(f"- {n}" for n in names)
            + "\n\nWhich single category fits this interest best? Answer as JSON: "
            '{"category": "<category>"}'
        ),
    )


def taxonomy_full_messages(names: Sequence[str]) -> list[dict[str, str]]:
    """The taxonomy question over every category, with the interest in the slot at the very
    end (so the long category list is a prefix shared by all interests)."""
    return chat(
        "You file interests under a category.",
        "Categories:\n"
        + "\n".join(f"- {n}" for n in names)
        + "\n\nWhich single category above fits the interest below best? Answer as JSON: "
        '{"category": "<category>"}\n'
        f"Interest: {SLOT}",
    )


# -- embeddings and the taxonomy shortlist -------------------------------------------------
