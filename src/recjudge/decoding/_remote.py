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
import logging
import math
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from pydantic import ConfigDict, Field, ValidationError

from recjudge._util import json_loads
from recjudge.decoding._api import BranchBias, ConstrainedOutput
from recjudge.decoding._compile import CompiledSchema, TokenTable, compile_schema
from recjudge.decoding._processors import (
    NEG_INF,
    BranchBiasProcessor,
    DecisionRecord,
    GrammarLogitsProcessor,
    _EvidenceTracker,
    veto_repeats,
    zero_signal,
)
from recjudge.decoding._schemas import (
    WIRE_KINDS,
    EvidenceFirst,
    Schema,
    remainder_ebnf,
    schema_from_spec,
    schema_spec,
)
from recjudge.llm import EngineRequest, SamplingConfig, ServerError

if TYPE_CHECKING:
    from recjudge.llm import EngineBackend

if TYPE_CHECKING:
    from recjudge.decoding._api import ConstrainedOutput
    from recjudge.llm import SamplingConfig

log = logging.getLogger(__name__)

XARGS_KEY = "recjudge"  # the same key as recjudge.llm._vllm.XARGS_KEY
PAYLOAD_VERSION = 1
MAX_WATCH = 128  # vLLM's MAX_LOGPROB_TOKEN_IDS
# Bounds on what one request may ask the server to compile: a grammar over an unbounded
# list of unbounded strings would let one client hold the server's CPU and memory.
MAX_PAYLOAD_CHARS = 1_000_000
MAX_SCHEMA_STRINGS = 5_000
MAX_STRING_CHARS = 16_384


def _check_size(raw: Any) -> None:
    text = raw if isinstance(raw, str) else json.dumps(raw, default=str)
    if len(text) > MAX_PAYLOAD_CHARS:
        raise ValueError(
            f"bias payload of {len(text):,} characters; the server accepts at most "
            f"{MAX_PAYLOAD_CHARS:,} (show fewer history items, e.g. --max-history)"
        )


def _check_strings(spec: Any) -> None:
    strings: list[str] = []

    def walk(x: Any) -> None:
        if isinstance(x, str):
            strings.append(x)
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, list | tuple):
            for v in x:
                walk(v)

    walk(spec)
    if len(strings) > MAX_SCHEMA_STRINGS:
        raise ValueError(
            f"the schema holds {len(strings):,} strings; the server accepts at most "
            f"{MAX_SCHEMA_STRINGS:,}"
        )
    longest = max(map(len, strings), default=0)
    if longest > MAX_STRING_CHARS:
        raise ValueError(
            f"a schema string of {longest:,} characters; the server accepts at most "
            f"{MAX_STRING_CHARS:,} per title or option"
        )


class BiasPayload(BranchBias):
    """Per-request settings of the engine-side bias processor: every field of ``BranchBias``
    (inherited, so a knob added there travels to the engine too) plus what one request
    needs on the engine.

    Attributes:
        schema_: the output schema in wire form (``schema_spec``).
        lead_ids: tokens of the answer's opening already placed at the end of the prompt.
        signal: sigma (binary decisions) or one signal per branch.
        beta, adaptive, block_one_sided (and any other): ``BranchBias``'s; ``beta`` defaults
            to 0 on the wire (a payload without it biases nothing).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    v: int = PAYLOAD_VERSION
    schema_: dict[str, Any] = Field(alias="schema")
    lead_ids: list[int] = []
    signal: float | list[float] = 0.0
    beta: float = Field(0.0, ge=0)

    @classmethod
    def build(
        cls,
        schema: Schema,
        lead_ids: Sequence[int],
        signal: float | Sequence[float],
        bias: BranchBias | float,
    ) -> BiasPayload:
        """The payload of one request; ``bias`` a ``BranchBias`` (or its beta alone)."""
        if not isinstance(bias, BranchBias):
            bias = BranchBias(beta=float(bias))
        sig = float(signal) if isinstance(signal, int | float) else [float(s) for s in signal]
        return cls(
            schema=schema_spec(schema),
            lead_ids=[int(t) for t in lead_ids],
            signal=sig,
            **bias.model_dump(),
        )

    def encode(self) -> str:
        return json.dumps(self.model_dump(by_alias=True), separators=(",", ":"))

    @classmethod
    def from_extra_args(cls, extra_args: dict[str, Any] | None) -> BiasPayload | None:
        """The payload in a request's extra args, None if absent; malformed -> ValueError."""
        if not extra_args or XARGS_KEY not in extra_args:
            return None
        raw = extra_args[XARGS_KEY]
        _check_size(raw)
        try:
            data = json_loads(raw) if isinstance(raw, str) else raw
            payload = cls.model_validate(data)
        except (json.JSONDecodeError, ValidationError, TypeError) as e:
            msg = f"extra_args[{XARGS_KEY!r}] is not a recjudge bias payload: {e}"
            raise ValueError(msg) from None
        if payload.v != PAYLOAD_VERSION:
            raise ValueError(
                f"bias payload version {payload.v}, this recjudge speaks {PAYLOAD_VERSION}; "
                "install the same recjudge version on the client and the server"
            )
        _check_strings(payload.schema_)
        schema_from_spec(payload.schema_)  # raises ValueError on a bad schema
        return payload

    def to_schema(self) -> Schema:
        return schema_from_spec(self.schema_)


def _bias_processor(
    payload: BiasPayload, schema: Schema, table: TokenTable
) -> BranchBiasProcessor | None:
    """A one-row bias processor for the payload, or None when the schema has no decision."""
    spec = schema.decision(table.json_literal)
    if spec is None:
        return None
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
        self.bias = _bias_processor(payload, schema, table)
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
        veto_repeats(self.tracker, row[0], self.table)
        if self.bias is not None and not self.bias.committed(0):
            self.bias.apply(row)
        return logits


# -- client side ---------------------------------------------------------------------------
def _allowed(matcher: Any, width: int) -> list[int]:
    # xgrammar loads with the first grammar, not with this module
    import xgrammar as xgr  # noqa: PLC0415

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
    # xgrammar loads with the first grammar, not with this module
    import xgrammar as xgr  # noqa: PLC0415

    table = compiled.table
    spec = compiled.decision()
    if spec is None:
        return [], True
    probe = BranchBiasProcessor([spec], table.token_bytes, [zero_signal(spec)], beta=0.0)
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
    table = compiled.table
    bias = _bias_processor(payload, compiled.schema, table)
    if bias is None:
        return None
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


PROBE_BETA = 1000.0  # large enough that the bias decides whatever the model prefers

# The probe's outcome per backend object ("probing" while its own requests are in flight,
# "passed" after), kept here rather than written onto the backend: the backend declares
# ``needs_bias_probe`` and decoding never changes what a backend declares.
_PROBED: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def bias_probe_due(llm: EngineBackend) -> bool:
    """Whether ``engine_constrained`` probes ``llm`` before its next request: it declares
    ``needs_bias_probe`` and has not passed (nor is taking) the probe."""
    return bool(llm.needs_bias_probe) and llm not in _PROBED


def probe_bias(llm: EngineBackend) -> None:
    """Check once per backend object that the server applies recjudge's bias processor.

    The same evidence-first question is sent twice, with sigma +1 and -1 at a bias no model
    preference can outweigh: a server with the processor answers YES then NO. A server
    without it (a plain ``vllm serve``, another build) decodes both alike, and the decision
    records replayed from its logprobs would claim a bias it never applied.

    Raises:
        ServerError: the verdicts did not follow the bias.
    """
    _PROBED[llm] = "probing"  # the probe's own requests must not probe again
    try:
        prompt = llm.encode(llm.chat_prompt([{
            "role": "user",
            "content": "History: Heat (1995). Candidate: Up (2009). Is the candidate relevant? "
                       'Answer as JSON {"evidence": [...], "is_relevant": "YES" | "NO"}.',
        }]))  # fmt: skip
        schema = EvidenceFirst(["Heat (1995)"], 1)
        outs = engine_constrained(llm, [prompt, prompt], [schema, schema], [1.0, -1.0],
                                  BranchBias(beta=PROBE_BETA, adaptive=False))  # fmt: skip
        got = [None if o.value is None else o.value.get("is_relevant") for o in outs]
    except BaseException:
        del _PROBED[llm]  # asked again next time, never assumed
        raise
    if got != ["YES", "NO"]:
        del _PROBED[llm]
        raise ServerError(
            f"the server at {llm.config.base_url or llm.name} does not apply recjudge's bias "
            f"processor (a forced YES/NO probe came back {got}); start it with `recjudge "
            "serve`, or add --logits-processors recjudge.decoding.vllm:BranchBiasV1 with the "
            "same recjudge version"
        )
    _PROBED[llm] = "passed"


@dataclass
class EngineBatch:
    """Engine requests of one constrained decode, and what replays their results: one
    request per prompt (remainder grammar, bias payload, watched tokens)."""

    requests: list[Any]
    compiled: list[Any]
    payloads: list[Any]
    leads: list[list[int]]

    def finish(self, results: Sequence[Any]) -> list[ConstrainedOutput]:
        """The engine's results (one per request, in order) as ``ConstrainedOutput``s: text,
        parsed value and replayed decision record."""
        return [_replayed(c, p, r, lead, ConstrainedOutput)
                for c, p, r, lead in zip(self.compiled, self.payloads, results, self.leads,
                                         strict=True)]  # fmt: skip


def engine_batch(
    llm: Any,
    prompt_ids: Sequence[Sequence[int]],
    schemas: Sequence[Schema],
    signals: Sequence[Any] | None,
    bias: BranchBias | None,
    sampling: SamplingConfig | None = None,
    lead_ids: Sequence[int] | Sequence[Sequence[int]] = (),
    seeds: Sequence[int] | None = None,
) -> EngineBatch:
    """The engine requests of a constrained decode, as data (``engine_constrained``'s first
    half; the second is ``EngineBatch.finish``). ``llm`` needs a tokenizer and vocabulary
    only: the requests may run anywhere (``llm.submit``, a Ray Data LLM stage).

    Args:
        llm: the backend whose tokenizer the prompts were encoded with.
        prompt_ids: full prompts as token ids, each already ending with ``lead_ids``.
        schemas: the answer schema per prompt.
        signals: per prompt, sigma or a per-branch vector (None: zeros).
        bias: bias settings (None: record the decision without biasing).
        lead_ids: the prefilled opening of the answer (already at the end of every
            prompt): one list for all prompts, or one list per prompt.
        seeds: per-prompt sampling seeds (sampled decoding only).
    """
    sampling = sampling or SamplingConfig()
    bias = bias or BranchBias(beta=0.0)
    per_row = bool(lead_ids) and not isinstance(lead_ids[0], int)
    leads = [list(x) for x in lead_ids] if per_row else [list(lead_ids) for _ in prompt_ids]
    reqs, compiled_rows, payloads = [], [], []
    walks: dict[tuple[int, tuple[int, ...]], tuple[list[int], bool]] = {}
    for i, (ids, schema) in enumerate(zip(prompt_ids, schemas, strict=True)):
        lead = leads[i]
        if lead and list(ids[-len(lead) :]) != lead:
            raise ValueError(f"prompt {i} does not end with the lead tokens")
        compiled = compile_schema(schema, llm.tokenizer, llm.vocab_size)
        table = compiled.table
        lead_text = b"".join(table.token_bytes[t] for t in lead).decode("utf-8")
        try:
            grammar = remainder_ebnf(schema, lead_text, table.json_literal)
        except ValueError:
            # The grammar does not open with one literal holding the lead: let the
            # model decode the opening itself under the full grammar.
            ids, lead = list(ids[: len(ids) - len(lead)]), []
            leads[i] = lead
            grammar = schema.ebnf(table.json_literal)
        signal = signals[i] if signals is not None else None
        payload, watch = _bias_and_watch(i, schema, compiled, lead, signal, bias, walks)
        reqs.append(
            EngineRequest(
                list(map(int, ids)),
                grammar,
                payload.encode() if payload is not None else None,
                watch or [],
                sampling,
                int(seeds[i]) if seeds is not None else sampling.seed,
            )
        )
        compiled_rows.append(compiled)
        payloads.append(payload)
    return EngineBatch(reqs, compiled_rows, payloads, leads)


def engine_constrained(
    llm: EngineBackend,
    prompt_ids: Sequence[Sequence[int]],
    schemas: Sequence[Schema],
    signals: Sequence[Any] | None,
    bias: BranchBias | None,
    sampling: SamplingConfig | None = None,
    lead_ids: Sequence[int] | Sequence[Sequence[int]] = (),
    seeds: Sequence[int] | None = None,
) -> list[ConstrainedOutput]:
    """Constrained generation on an engine backend (vLLM, in process or a server) that
    applies the grammar and the bias itself; one output per prompt: the requests
    (``engine_batch``, same arguments) sent with ``llm.submit``, each decision record
    replayed (``EngineBatch.finish``). ``decode`` is the caller."""
    if bias_probe_due(llm):
        probe_bias(llm)
    batch = engine_batch(llm, prompt_ids, schemas, signals, bias, sampling, lead_ids, seeds)
    return batch.finish(llm.submit(batch.requests))


def _bias_and_watch(
    i: int, schema: Any, compiled: Any, lead: list[int], signal: Any, bias: Any, walks: dict
) -> tuple[Any, list[int] | None]:
    """The bias payload of prompt ``i`` and the tokens whose log-probs the engine returns
    at the decision (None, None for a schema without a decision on the wire)."""
    spec = compiled.decision()
    if schema.kind not in WIRE_KINDS:
        if schema.distinct_list() is not None:
            log.warning("%s: distinct entries are not enforced on vLLM", schema.kind)
        return None, None
    if spec is None and schema.distinct_list() is None:
        return None, None
    sig = signal if signal is not None else (zero_signal(spec) if spec else 0.0)
    payload = BiasPayload.build(schema, lead, sig, bias)
    # One user's candidates share a schema and lead: walk the grammar once per call.
    walk_key = (id(compiled), tuple(lead))
    if walk_key not in walks:
        walks[walk_key] = watch_tokens(compiled, lead)
    watch, complete = walks[walk_key]
    if not complete:
        log.warning(
            "prompt %d: %d tokens can take part in the decision; p_yes is replayed from the "
            "first 128 only",
            i,
            len(watch),
        )
    return payload, watch


def _replayed(compiled: Any, payload: Any, res: Any, lead: list[int], output_cls: Any) -> Any:
    """An engine result as a ``ConstrainedOutput``: its text, parsed value and replayed
    decision record."""
    tb = compiled.table.token_bytes
    ids = [t for t in res.token_ids if t not in compiled.table.stop_ids]
    text = b"".join(tb[t] for t in lead + ids if t < len(tb)).decode("utf-8", "replace")
    record = replay_decision(compiled, payload, ids, res.step_logprobs) if payload else None
    try:
        value = compiled.schema.parse(text)
    except ValueError:  # token budget ran out before the grammar completed
        value = None
    return output_cls(text=text, value=value, record=record, token_ids=ids)
