"""One store-backed, batched loop for the evaluators' closed questions.

Every evaluator (GISTBench, UserSumBench, RecSys Arena) asks many grammar-constrained
questions and must survive a crash: each batch's answers are written to the results store in
one transaction, and a rerun asks only what the store does not hold yet. This module is that
loop, once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from recjudge.decoding import ConstrainedOutput, Schema


@dataclass(frozen=True)
class StoredAsk:
    """One stored question.

    Attributes:
        key: its results-store key (a hash of everything that determines the answer).
        request: what is stored next to the answer (user, systems, ...), for people and
            for ``salvage``.
        messages: the chat.
        schema: the grammar the answer follows.
        result: turns the answer into the stored result (a JSON-safe dict).
    """

    key: str
    request: dict[str, Any]
    messages: list[dict[str, str]]
    schema: Schema
    result: Callable[[ConstrainedOutput], dict[str, Any]]


def default_result(answer: ConstrainedOutput) -> dict[str, Any]:
    """The parsed answer with its decision record (branches and their probabilities)."""
    rec = answer.record
    return {"value": answer.value, "branches": list(rec.branches), "p": list(rec.p_before)}


def ask_stored(
    llm: Any,
    store: Any,
    asks: Sequence[StoredAsk],
    *,
    sampling: Any = None,
    batch_size: int = 8,
    decode_rows: int | None = None,
    sort_by_length: bool = False,
    desc: str = "asking",
    progress: bool = True,
) -> dict[str, dict[str, Any]]:
    """Ask every question the store does not hold, ``batch_size`` at a time, and return the
    stored result of every question (key -> result).

    Args:
        llm: a transformers backend (``ask``'s contract).
        store: a :class:`ResultsStore`; each batch is one transaction, so a crash loses at
            most the batch in flight and a rerun resumes.
        asks: the questions; duplicate keys are asked once.
        sampling: ``SamplingConfig`` for all questions.
        batch_size: questions per ``ask`` call (and per transaction).
        decode_rows: rows decoded together (default ``batch_size``); long free-text answers
            decode best one row at a time (``1``).
        sort_by_length: order the pending questions by prompt length first, so a batch shares
            one padding bucket (worth it for short answers after long prompts).
        desc: progress-bar label.
        progress: show a progress bar with ETA.
    """
    from recjudge.reward._ask import ask

    unique = list({a.key: a for a in asks}.values())
    have = store.get_many([a.key for a in unique])
    todo = [a for a in unique if a.key not in have]
    if sort_by_length and len(todo) > 1:
        length = {a.key: len(llm.encode(llm.chat_prompt(a.messages))) for a in todo}
        todo.sort(key=lambda a: length[a.key])
    bar = None
    if progress and todo:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(unique), initial=len(unique) - len(todo), desc=desc)
    rows = decode_rows or batch_size
    for b in range(0, len(todo), batch_size):
        part = todo[b : b + batch_size]
        answers = ask(
            llm,
            [a.messages for a in part],
            [a.schema for a in part],
            sampling=sampling,
            decode_rows=rows,
        )
        store.put_many((q.key, q.request, q.result(a)) for q, a in zip(part, answers, strict=True))
        if bar is not None:
            bar.update(len(part))
    if bar is not None:
        bar.close()
    return store.get_many([a.key for a in asks])
