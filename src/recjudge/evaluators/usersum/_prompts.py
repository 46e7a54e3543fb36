"""UserSumBench prompts, in the roles of the paper's appendix A: the single-step summary
(the baseline), the segment summary with its ``{time_range}``, the regeneration that sees the
previous summary and the failed question-answer pairs, the combination of segment summaries,
the query check, question generation, the question-answer check, and the prediction tasks.

The texts are ours (the appendix's wording is not reproduced); what each prompt is given
follows the paper. The single-step baseline carries no anti-hallucination guard: the guard is
what the hierarchy's verifier provides.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from recjudge._util import chat
from recjudge.evaluators.usersum._metrics import LETTERS

USERSUM_PROMPT_VERSION = "usersum-v2"
USERSUM_PROMPT_FINGERPRINT = "usersum-v2:f99331c4b66d6bb1"  # tests/test_prompt_versions.py
SYSTEM = "You write concise user preference summaries."
FORM = "Write two parts, 'Summary:' and 'Insights:', together at most {words} words."


def activity_lines(acts: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per activity, with the rating when there is one."""
    # ratings are floats from the dataset; NaN (no rating) is the only value unequal to itself
    return [
        f"- {a['text']} (rated {a['rating']:g})" if a["rating"] == a["rating"] else f"- {a['text']}"
        for a in acts
    ]


def _activities(acts: Sequence[Mapping[str, Any]], time_range: str) -> str:
    when = f" from {time_range}" if time_range else ""
    return f"My activities{when}, oldest first:\n" + "\n".join(activity_lines(acts))


def summary_messages(
    acts: Sequence[Mapping[str, Any]], query: str, word_limit: int, time_range: str = ""
) -> list[dict[str, str]]:
    """A.1 (single step, no ``time_range``) and A.2 (a segment of the time hierarchy)."""
    body = f"{_activities(acts, time_range)}\n\n{query}. {FORM.format(words=word_limit)}"
    return chat(SYSTEM, body)


def regenerate_messages(
    acts: Sequence[Mapping[str, Any]],
    query: str,
    word_limit: int,
    time_range: str,
    previous: str,
    failed: Sequence[str],
) -> list[dict[str, str]]:
    """A.3: rewrite a segment summary that the verifier rejected, seeing the previous summary
    and each failed check (question, claimed answer, what the log says)."""
    problems = "\n".join(failed)
    body = (
        f"{_activities(acts, time_range)}\n\nYour previous summary of them:\n{previous}\n\n"
        f"A verifier found these problems:\n{problems}\n\n{query}. Rewrite the summary so "
        f"that every statement is supported by the activities. {FORM.format(words=word_limit)}"
    )
    return chat(SYSTEM, body)


def combine_messages(
    parts: Sequence[str], ranges: Sequence[str], query: str, word_limit: int
) -> list[dict[str, str]]:
    """A.4: combine the segment summaries (oldest first, each with its time range)."""
    body = "\n\n".join(
        f"Period {i + 1} ({r}):\n{p}" if r else f"Period {i + 1}:\n{p}"
        for i, (p, r) in enumerate(zip(parts, ranges, strict=True))
    )
    return chat(
        SYSTEM,
        f"Summaries of my activity in consecutive periods, oldest first:\n\n{body}"
        f"\n\n{query}. Combine them into one summary that keeps long-term patterns and "
        "focuses on my recent interests. " + FORM.format(words=word_limit),
    )


def query_check_messages(summary: str, query: str) -> list[dict[str, str]]:
    """A.5: does the summary answer the request?"""
    return chat(
        "You verify summaries.",
        (
            f'Request: "{query}".\nSummary:\n{summary}\n\nDoes the summary answer the '
            "request (about the user's preferences, in the requested form)? Answer "
            "consistent or inconsistent as JSON."
        ),
    )


def qg_messages(summary: str, n: int) -> list[dict[str, str]]:
    """A.6: question generation whose answers are the summary's key entities."""
    return chat(
        "You write fact-checking questions.",
        (
            f"Summary:\n{summary}\n\nExtract the {n} most important key entities (titles, "
            "genres, people, periods) from the summary. For each, write a question whose "
            f"answer is that entity. Answer as JSON: "
            '[{"question": "...", "answer": "<entity>"}, ...]'
        ),
    )


def qa_messages(
    acts: Sequence[Mapping[str, Any]], question: str, answer: str
) -> list[dict[str, str]]:
    """A.7: answer the question from the log, then judge the summary's answer."""
    return chat(
        "You check claims against activity logs.",
        (
            "Activity log:\n"
            + "\n".join(activity_lines(acts))
            + f'\n\nQuestion: {question}\nProposed answer: "{answer}".\nAnswer the question '
            "from the log yourself in a few words, then say whether the proposed answer is "
            "consistent with the log."
        ),
    )


def predict_messages(
    summary: str,
    options: Sequence[str],
    what: str,
    recent: Sequence[Mapping[str, Any]] | None,
) -> list[dict[str, str]]:
    """The four prediction tasks (next item / category, with or without recent activity)."""
    recent_part = (
        "\n\nTheir most recent activities, newest first:\n" + "\n".join(activity_lines(recent))
        if recent
        else ""
    )
    opts = "\n".join(f"{letter}. {o}" for letter, o in zip(LETTERS, options, strict=False))
    return chat(
        "You predict what a user does next.",
        (
            f"Summary of the user's preferences:\n{summary}{recent_part}\n\n"
            f"Which {what} comes next for this user?\n{opts}\n\nAnswer with the letter."
        ),
    )
