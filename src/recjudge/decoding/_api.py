"""One-call constrained decoding: grammar + branch bias -> parsed object + decision record."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from recjudge.decoding._compile import compile_schema
from recjudge.decoding._processors import (
    BranchBiasProcessor,
    DecisionRecord,
    GrammarLogitsProcessor,
    zero_signal,
)
from recjudge.decoding._schemas import Schema
from recjudge.llm import capabilities_of

if TYPE_CHECKING:
    from recjudge.llm import LLMBackend


class BranchBias(BaseModel):
    """The behavioural bias at a decision step.

    Attributes:
        beta: strength; 0 leaves the logits exactly unchanged.
        adaptive: ``Delta = beta * (1 + E_n) * sigma`` (BRIEF) or ``beta * sigma``.
        block_one_sided: hold deciding tokens back until every branch is decidable at once.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    beta: float = Field(25.0, ge=0)
    adaptive: bool = True
    block_one_sided: bool = True


@dataclass
class ConstrainedOutput:
    """A constrained generation: raw text, parsed value and the decision record."""

    text: str
    value: Any
    record: DecisionRecord | None
    token_ids: list[int]


def make_processors(
    llm: LLMBackend,
    schemas: Sequence[Schema],
    signal: Sequence[Any] | None,
    bias: BranchBias | None,
) -> tuple[GrammarLogitsProcessor, BranchBiasProcessor | None]:
    """Compile ``schemas`` for ``llm`` and build the per-batch processors."""
    compiled = [compile_schema(s, llm.tokenizer, llm.vocab_size) for s in schemas]
    grammar = GrammarLogitsProcessor(compiled)
    specs = [c.decision() for c in compiled]
    if any(spec is None for spec in specs):
        return grammar, None
    bias = bias or BranchBias(beta=0.0)
    sig = list(signal) if signal is not None else [zero_signal(spec) for spec in specs]
    proc = BranchBiasProcessor(
        specs,
        compiled[0].table.token_bytes,
        sig,
        beta=bias.beta,
        adaptive=bias.adaptive,
        block_one_sided=bias.block_one_sided,
    )
    return grammar, proc


def constrained_generate(
    llm: LLMBackend,
    prompts: Sequence[str],
    schemas: Schema | Sequence[Schema],
    *,
    signal: Sequence[Any] | None = None,
    bias: BranchBias | None = None,
    sampling: Any = None,
) -> list[ConstrainedOutput]:
    """Generate through transformers ``generate()`` with the grammar and the branch bias:
    the naive reference path the fast engine is checked against (parity tests, benches).
    Every other constrained answer goes through ``decode``; on a backend that decodes in its
    engine this delegates to it.

    Args:
        llm: a backend (``recjudge.llm``) with ``tokenizer``, ``vocab_size`` and ``generate``.
        prompts: rendered prompts (use ``llm.chat_prompt``).
        schemas: one schema for all prompts, or one per prompt.
        signal: per prompt, sigma (binary decisions) or a per-branch vector (k-way).
        bias: the bias settings; None records the decision without biasing.
        sampling: a ``SamplingConfig`` (greedy by default).

    Returns:
        One ConstrainedOutput per prompt, in order.
    """
    schemas = [schemas] * len(prompts) if isinstance(schemas, Schema) else list(schemas)
    if len(schemas) != len(prompts):
        raise ValueError(f"{len(schemas)} schemas for {len(prompts)} prompts")
    if capabilities_of(llm).engine_constraints:  # no generate() to run: the engine's path
        # import cycle: _decode takes its bias type from this module
        from recjudge.decoding._decode import DecodeJob, decode  # noqa: PLC0415

        job = DecodeJob([llm.encode(p) for p in prompts], schemas, signal=signal, bias=bias,
                        sampling=sampling, jump_forward=False)  # fmt: skip
        return decode(llm, job)
    grammar, bias_proc = make_processors(llm, schemas, signal, bias)
    procs = [grammar] + ([bias_proc] if bias_proc is not None else [])
    gens = llm.generate(prompts, processors=procs, sampling=sampling)
    return collect_outputs(grammar, bias_proc, schemas, [g.token_ids for g in gens])


def collect_outputs(
    grammar: GrammarLogitsProcessor,
    bias: BranchBiasProcessor | None,
    schemas: Sequence[Schema],
    token_ids: Sequence[list[int]],
) -> list[ConstrainedOutput]:
    """Parsed values and decision records of a finished constrained generation, in row order.

    A row that did not complete its grammar (token budget) gets ``value=None``.
    """
    out = []
    for row, schema in enumerate(schemas):
        text = grammar.text(row)
        out.append(
            ConstrainedOutput(
                text=text,
                value=schema.parse(text) if grammar.done(row) else None,
                record=bias.records[row] if bias is not None else None,
                token_ids=list(token_ids[row]),
            )
        )
    return out
