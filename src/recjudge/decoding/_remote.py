"""The branch bias for engines that run logits processors in their own process (vLLM).

Such an engine applies the grammar itself (structured outputs) and calls a custom logits
processor per request. Three pieces, none importing vLLM:

* ``BiasPayload``: what a request carries in ``SamplingParams.extra_args`` (JSON under the
  key ``recjudge``; the OpenAI-compatible server takes it as ``vllm_xargs``).
* ``RequestBias``: the engine-side per-request state. It rebuilds the schema, tracks the
  generated tokens, enforces distinct evidence and adds the bias exactly as
  ``BranchBiasProcessor`` does in the transformers engine (same code).
* ``watch_tokens`` / ``replay_decision``: the client asks the engine for the log-probabilities
  of every token that can take part in the decision (a small set found by walking the grammar
  from the prefilled opening), then replays the bias on them to recover p_yes before and after
  the bias, E_n and Delta. Nothing but standard log-probabilities crosses the wire, so this
  works through any OpenAI-compatible vLLM server, local or remote.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from recjudge.decoding._compile import CompiledSchema, TokenTable
from recjudge.decoding._processors import (
    NEG_INF,
    BranchBiasProcessor,
    DecisionRecord,
    _EvidenceTracker,
)
from recjudge.decoding._schemas import Schema, schema_from_spec, schema_spec

XARGS_KEY = "recjudge"
PAYLOAD_VERSION = 1
MAX_WATCH = 128  # vLLM's MAX_LOGPROB_TOKEN_IDS


class BiasPayload(BaseModel):
    """Per-request settings of the engine-side bias processor.

    Attributes:
        schema_: the output schema in wire form (``schema_spec``).
        lead_ids: tokens of the answer's opening already placed at the end of the prompt.
        signal: sigma (binary decisions) or one signal per branch.
        beta, adaptive, block_one_sided: as in ``BranchBias``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    v: int = PAYLOAD_VERSION
    schema_: dict[str, Any] = Field(alias="schema")
    lead_ids: list[int] = []
    signal: float | list[float] = 0.0
    beta: float = Field(0.0, ge=0)
    adaptive: bool = True
    block_one_sided: bool = True

    @classmethod
    def build(
        cls,
        schema: Schema,
        lead_ids: Sequence[int],
        signal: float | Sequence[float],
        beta: float,
        adaptive: bool = True,
        block_one_sided: bool = True,
    ) -> BiasPayload:
        sig = float(signal) if isinstance(signal, int | float) else [float(s) for s in signal]
        return cls(
            schema=schema_spec(schema),
            lead_ids=[int(t) for t in lead_ids],
            signal=sig,
            beta=float(beta),
            adaptive=adaptive,
            block_one_sided=block_one_sided,
        )

    def encode(self) -> str:
        return json.dumps(self.model_dump(by_alias=True), separators=(",", ":"))

    @classmethod
    def from_extra_args(cls, extra_args: dict[str, Any] | None) -> BiasPayload | None:
        """The payload in a request's extra args, None if absent; malformed -> ValueError."""
        if not extra_args or XARGS_KEY not in extra_args:
            return None
        raw = extra_args[XARGS_KEY]
        try:
            data = json.loads(raw) if isinstance(raw, str) else raw
            payload = cls.model_validate(data)
        except (json.JSONDecodeError, ValidationError, TypeError) as e:
            msg = f"extra_args[{XARGS_KEY!r}] is not a recjudge bias payload: {e}"
            raise ValueError(msg) from None
        if payload.v != PAYLOAD_VERSION:
            raise ValueError(
                f"bias payload version {payload.v}, this recjudge speaks {PAYLOAD_VERSION}; "
                "install the same recjudge version on the client and the server"
            )
        schema_from_spec(payload.schema_)  # raises ValueError on a bad schema
        return payload

    def to_schema(self) -> Schema:
        return schema_from_spec(self.schema_)


def _bias_processor(payload: BiasPayload, schema: Schema, table: TokenTable) -> BranchBiasProcessor:
    spec = schema.decision(table.json_literal)
    if spec is None:
        raise ValueError(f"schema {schema.kind!r} has no decision point to bias")
    return BranchBiasProcessor(
        [spec],
        table.token_bytes,
        [payload.signal],
        beta=payload.beta,
        adaptive=payload.adaptive,
        block_one_sided=payload.block_one_sided,
    )


class RequestBias:
    """Engine-side state of one request: distinct evidence plus the branch bias.

    ``process(output_ids, logits)`` is called once per decoding step with every token the
    request has generated so far (after the prefilled lead) and its logits row after the
    engine's grammar mask; it changes ``logits`` in place and returns it.
    """

    def __init__(self, payload: BiasPayload, table: TokenTable) -> None:
        schema = payload.to_schema()
        self.table = table
        self.bias = _bias_processor(payload, schema, table) if schema.decision() else None
        distinct = schema.distinct_list()
        self.tracker = (
            _EvidenceTracker(*distinct, table.json_literal) if distinct is not None else None
        )
        self.seen = 0
        for t in payload.lead_ids:
            self._accept(t)

    def _accept(self, token: int) -> None:
        if not 0 <= token < len(self.table.token_bytes):
            return  # ids past the tokenizer carry no text
        if self.bias is not None:
            self.bias.accept(0, token)
        if self.tracker is not None:
            self.tracker.feed(self.table.token_bytes[token])

    def process(self, output_ids: Sequence[int], logits: torch.Tensor) -> torch.Tensor:
        for t in output_ids[self.seen :]:
            self._accept(int(t))
        self.seen = len(output_ids)
        row = logits.view(1, -1)
        if self.tracker is not None and self.tracker.active():
            tb = self.table.token_bytes
            allowed = torch.isfinite(row[0]).nonzero().flatten().tolist()
            veto = [t for t in allowed if t < len(tb) and tb[t] and not self.tracker.allows(tb[t])]
            if veto:
                row[0, veto] = NEG_INF
        if self.bias is not None and not self.bias.committed(0):
            self.bias.apply(row)
        return logits


# -- client side ---------------------------------------------------------------------------
def _allowed(matcher: Any, width: int) -> list[int]:
    import xgrammar as xgr

    mask = xgr.allocate_token_bitmask(1, width)
    matcher.fill_next_token_bitmask(mask, 0)
    scores = torch.zeros(1, width)
    xgr.apply_token_bitmask_inplace(scores, mask)
    return torch.isfinite(scores[0]).nonzero().flatten().tolist()


def watch_tokens(
    compiled: CompiledSchema, lead_ids: Sequence[int], max_states: int = 256
) -> tuple[list[int], bool]:
    """Every token the grammar allows at any step before the branch decision is settled.

    Walks the grammar from the prefilled lead along tokens that keep the decision open.
    The engine reports log-probabilities for exactly these tokens, which is all
    ``replay_decision`` needs. Returns (token ids, complete); ``complete`` is False when the
    walk was cut at ``max_states`` or the set exceeds vLLM's limit of 128 ids.
    """
    import xgrammar as xgr

    table = compiled.table
    spec = compiled.decision()
    if spec is None:
        return [], True
    probe = BranchBiasProcessor(
        [spec],
        table.token_bytes,
        [0.0 if len(spec.names) <= 2 else [0.0] * len(spec.names)],
        beta=0.0,
    )
    matcher = xgr.GrammarMatcher(compiled.grammar)
    text = b""
    for t in lead_ids:
        if not matcher.accept_token(int(t)):
            raise ValueError(f"lead token {t} is not allowed by the {compiled.schema.kind} grammar")
        text += table.token_bytes[t]
    watched: set[int] = set()
    frontier = [(matcher, text)]
    visited = {text}
    complete = True
    while frontier:
        m, txt = frontier.pop()
        live = probe._live(0, txt)
        if len(live) <= 1:
            continue
        for t in _allowed(m, table.width):
            watched.add(t)
            nxt = txt + table.token_bytes[t]
            after = [i for i in probe._live(0, nxt) if i in live]
            if len(after) == len(live) and nxt not in visited:  # still undecided
                if len(visited) >= max_states:
                    complete = False
                    continue
                visited.add(nxt)
                child = m.fork()
                child.accept_token(t)
                frontier.append((child, nxt))
    ids = sorted(watched)
    if len(ids) > MAX_WATCH:
        complete = False
        ids = ids[:MAX_WATCH]
    return ids, complete


def replay_decision(
    compiled: CompiledSchema,
    payload: BiasPayload,
    output_ids: Sequence[int],
    step_logprobs: Sequence[dict[int, float]],
) -> DecisionRecord | None:
    """Recompute the decision record from the engine's per-step log-probabilities.

    ``step_logprobs[s]`` maps watched token ids to their log-probability at step ``s``
    (before the bias; masked tokens may be ``-inf`` or absent). The grammar is applied again
    here, so it does not matter whether the engine reported them before or after its mask.
    The record's ``extra["coverage"]`` is the smallest probability mass the watched tokens
    held at a pre-decision step (1.0 when the watch set covered every allowed token).
    """
    from recjudge.decoding._processors import GrammarLogitsProcessor

    table = compiled.table
    schema = compiled.schema
    if schema.decision() is None:
        return None
    bias = _bias_processor(payload, schema, table)
    grammar = GrammarLogitsProcessor([compiled])
    for t in payload.lead_ids:
        grammar.accept(0, int(t))
        bias.accept(0, int(t))
    coverage = 1.0
    for step, tok in enumerate(output_ids):
        if bias.committed(0) or grammar.done(0):
            break
        if step >= len(step_logprobs):
            raise ValueError(f"no log-probabilities for step {step}; ask for logprob_token_ids")
        row = torch.full((1, table.width), NEG_INF)
        lp = step_logprobs[step]
        for t, v in lp.items():
            if 0 <= t < table.width and v is not None and math.isfinite(v):
                row[0, t] = float(v)
        mass = sum(math.exp(v) for v in lp.values() if v is not None and math.isfinite(v))
        grammar.mask(row)
        bias.apply(row)
        coverage = min(coverage, mass)
        grammar.accept(0, int(tok))
        bias.accept(0, int(tok))
    rec = bias.records[0]
    rec.extra["coverage"] = coverage
    return rec
