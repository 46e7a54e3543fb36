"""Closed questions through the reward core: grammar + branch record (+ bias) on the engine."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from recjudge.decoding import (
    BranchBias,
    ConstrainedOutput,
    Schema,
    collect_outputs,
    make_processors,
)
from recjudge.llm import SamplingConfig


def ask(
    llm: Any,
    messages: Sequence[Sequence[dict[str, str]]],
    schemas: Schema | Sequence[Schema],
    *,
    signal: Sequence[Any] | None = None,
    bias: BranchBias | None = None,
    sampling: SamplingConfig | None = None,
    seeds: Sequence[int] | None = None,
) -> list[ConstrainedOutput]:
    """Ask each chat a grammar-constrained question; results are batch-invariant.

    Every evaluator's closed question (verdicts, multiple choice, categories) goes through
    here, so parsing never fails and each answer carries its decision record (branch
    probabilities before and after any bias).

    Args:
        llm: a transformers backend.
        messages: one chat (list of role/content dicts) per question.
        schemas: one schema for all, or one per question.
        signal, bias: optional behavioural bias at the decision step.
        sampling: decoding settings (greedy by default; set max_new_tokens to fit).
        seeds: per-question seeds for sampling.
    """
    from recjudge.llm._engine import constrained_decode

    n = len(messages)
    schemas = [schemas] * n if isinstance(schemas, Schema) else list(schemas)
    if len(schemas) != n:
        raise ValueError(f"{len(schemas)} schemas for {n} questions")
    ids = [llm.encode(llm.chat_prompt(list(m))) for m in messages]
    grammar, proc = make_processors(llm, schemas, signal, bias)

    def step(scores, rows):
        grammar.mask(scores, rows)
        if proc is not None:
            proc.apply(scores, rows)

    def accept(row, tok):
        grammar.accept(row, tok)
        if proc is not None:
            proc.accept(row, tok)

    tokens = constrained_decode(
        llm,
        ids,
        step,
        accept,
        grammar.finish_forced,  # stop as soon as the rest is forced
        sampling=sampling or SamplingConfig(max_new_tokens=512),
        seeds=seeds,
    )
    return collect_outputs(grammar, proc, schemas, tokens)
