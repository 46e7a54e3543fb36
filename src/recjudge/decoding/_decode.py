"""The one constrained-decoding entry point: ``decode(llm, job)``.

Every grammar-constrained answer recjudge asks for (a judgment, a closed question, a
question over a shared template, a sweep's recording pass) is a ``DecodeJob`` handed to
``decode``, which owns the choice of path from what the backend declares
(``recjudge.llm.Capabilities``):

- engine-side constraints (vLLM in process, a server): whole requests with the remainder
  grammar and the bias payload (``engine_constrained``);
- local decoding (transformers): recjudge's grammar mask and branch bias at every step of the
  fast engine, over shared-prefix KV caches when the job has prefixes (one or several users'
  rows in the same steps: ``llm._fast.decode_shared``) or batched independent prompts
  (``decode_prompts``), the batch-invariant engine when ``deterministic``.

One lead policy: with ``jump_forward`` each row's answer opens with the grammar's forced
text, cut after its last letter or digit (e.g. ``{"evidence``), prefilled with the prompt;
the model then writes the merged tokens that follow (``": ["``) itself, since forcing them as
separate prompt text puts the next token off-distribution.

One stop rule: a row stops when the rest of its answer is forced by the grammar (accepted as
text without model steps); with ``stop_at_decision`` also as soon as its decision is made,
unless it chose ``keep_branch`` (a judgment that must write its evidence keeps decoding after
YES). An answer that stopped early ends with the grammar's forced continuation.

The second job kind, ``OptionJob``: the most likely of a closed set of whole answers
(summed token log-probabilities of each option, found exactly over the options' token trie,
``recjudge.llm.best_options``), on the model's own forwards or, on engine backends, over the
engine's next-token log-probabilities; refused where the backend does not declare
``option_scoring``.

Adding a backend means declaring its ``Capabilities`` (and, for an engine, ``submit``): no
caller changes.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, overload

from recjudge._util import RunFault
from recjudge.decoding._api import BranchBias, ConstrainedOutput, make_processors
from recjudge.decoding._remote import bias_probe_due, engine_batch, probe_bias
from recjudge.decoding._schemas import Schema
from recjudge.llm import (
    EngineJob,
    SamplingConfig,
    best_options,
    capabilities_of,
    decode_prompts,
    decode_shared,
)

if TYPE_CHECKING:
    from recjudge.llm import BestOption, LLMBackend


@dataclass(frozen=True)
class DecodeJob:
    """One batch of constrained answers.

    Attributes:
        suffixes: per row, its prompt's token ids after ``prefix`` (the whole prompt when
            ``prefix`` is None).
        schemas: per row, the answer's schema.
        prefix: token ids every row shares (encoded and prefilled once); None: the rows are
            independent prompts (batches still share their common head on the fast engine).
        prefixes: instead of ``prefix``, several prefixes (several users' histories), each
            encoded once; row ``i`` follows ``prefixes[prefix_of[i]]``. The fast engine
            decodes the rows of every prefix in the same steps.
        prefix_of: with ``prefixes``, each row's prefix index.
        signal: per row, sigma (a YES/NO decision) or a per-branch vector (None: zeros).
        bias: the branch bias at the decision step (None: record without biasing).
        sampling: a ``SamplingConfig`` (greedy by default).
        seeds: per-row sampling seeds.
        jump_forward: prefill each row's forced opening (the lead policy above).
        stop_at_decision: stop a row once its decision is made (a read-out).
        keep_branch: with ``stop_at_decision``, the branch whose rows keep decoding.
        rows: rows per decode step (with ``deterministic``: the fixed row count).
        deterministic: the batch-invariant engine.
        head: ``allowed`` computes the LM head only for the tokens the grammar allows (the
            judge's default; the same argmax, less work; shared-prefix jobs on the fast
            engine), ``full`` for every token.
        explore: a sweep's per-row exploration hook (``BranchBiasProcessor.explore``);
            needs a backend with ``step_scores``.
        draft: on the fast engine, feed each row the tokens of its grammar-forced text
            (``draft_ids``) with its next token and keep those the model itself chooses:
            fewer forwards, the same tokens up to a batch shape's rounding (like ``rows``,
            not part of a result's key).
    """

    suffixes: Sequence[Sequence[int]]
    schemas: Sequence[Schema]
    prefix: Sequence[int] | None = None
    prefixes: Sequence[Sequence[int]] | None = None
    prefix_of: Sequence[int] | None = None
    signal: Sequence[Any] | None = None
    bias: BranchBias | None = None
    sampling: Any = None
    seeds: Sequence[int] | None = None
    jump_forward: bool = True
    stop_at_decision: bool = False
    keep_branch: str | None = None
    rows: int = 8
    deterministic: bool = False
    head: str = "full"
    explore: Any = None
    draft: bool = True

    def __post_init__(self) -> None:
        if len(self.schemas) != len(self.suffixes):
            raise ValueError(f"{len(self.schemas)} schemas for {len(self.suffixes)} rows")
        if self.signal is not None and len(self.signal) != len(self.suffixes):
            raise ValueError(f"{len(self.signal)} signals for {len(self.suffixes)} rows")
        if self.head not in ("allowed", "full"):
            raise ValueError(f"head must be 'allowed' or 'full', not {self.head!r}")
        if self.prefix is not None and self.prefixes is not None:
            raise ValueError("give prefix (one shared) or prefixes with prefix_of, not both")
        if (self.prefixes is None) != (self.prefix_of is None):
            raise ValueError("prefixes and prefix_of go together")
        if self.prefix_of is not None and (
            len(self.prefix_of) != len(self.suffixes)
            or any(not 0 <= g < len(self.prefixes or ()) for g in self.prefix_of)
        ):
            raise ValueError(f"prefix_of must give each of {len(self.suffixes)} rows one of "
                             f"{len(self.prefixes or ())} prefixes")  # fmt: skip

    def grouped(self) -> tuple[list[list[int]], list[int]] | None:
        """``(prefixes, prefix_of)`` whichever way the job gave them; None: no prefix."""
        if self.prefixes is not None and self.prefix_of is not None:
            return [list(p) for p in self.prefixes], list(self.prefix_of)
        if self.prefix is not None:
            return [list(self.prefix)], [0] * len(self.suffixes)
        return None


def lead_ids(llm: LLMBackend, grammar: Any, row: int) -> list[int]:
    """Token ids of the forced opening of ``row``'s answer, cut after its last letter or
    digit (e.g. ``{"answer``), so the model still produces the merged ``": "`` tokens
    itself."""
    forced = grammar.jump_forward(row)
    cut = max((i for i, ch in enumerate(forced) if ch.isalnum()), default=-1)
    return llm.encode(forced[: cut + 1]) if cut >= 0 else []


def draft_ids(llm: LLMBackend, grammar: Any) -> Any:
    """The engine's ``draft(row)`` hook: the token ids of the text ``row``'s grammar forces
    next (e.g. the rest of a title once its first tokens single it out, or a closing
    ``"``), tokenized on their own. A guess only: the engine keeps the tokens the model
    chooses itself, so a tokenization that differs from the model's costs a wasted slot,
    never a changed answer. A draft stops before any token without text (a title spelling
    ``<|im_end|>`` encodes to that special token: untrusted text is never fed to the model
    as one). Encodings are cached by text (rows share their keys)."""
    texts = grammar.table.token_bytes

    @functools.lru_cache(maxsize=4096)
    def encode(text: str) -> tuple[int, ...]:
        ids = llm.encode(text)
        cut = next((k for k, t in enumerate(ids) if not (0 <= t < len(texts) and texts[t])),
                   len(ids))  # fmt: skip
        return tuple(ids[:cut])

    def draft(row: int) -> list[int]:
        forced = grammar.jump_forward(row)
        return list(encode(forced)) if forced else []

    return draft


def _hooks(grammar: Any, proc: Any) -> tuple[Any, Any]:
    """The engine's per-step hook (grammar mask, then bias) and per-token hook."""

    def step(scores, rows, columns=None):
        grammar.mask(scores, rows, columns)
        if proc is not None:
            proc.apply(scores, rows, columns)

    def accept(row, tok):
        grammar.accept(row, tok)
        if proc is not None:
            proc.accept(row, tok)

    return step, accept


#: tokens an engine read-out may take to reach the decision: after the jump-forward lead
#: (``{"evidence``) the decision comes within the next few tokens (``": [``, ``": []``)
READOUT_STEPS = 4


class EngineStage:
    """A ``DecodeJob`` on an engine backend as data, in rounds (``engine_stage`` builds it):
    ``requests`` are what to run now (``EngineRequest``s, anywhere: ``llm.submit``, a Ray Data
    LLM stage); ``feed`` takes their results in order, replays the decisions and leaves the
    next round's requests, or none (``done``); ``outputs`` then holds one
    ``ConstrainedOutput`` per row.

    A read-out stops at the decision, as on the local engines: each request may generate
    ``READOUT_STEPS`` tokens, enough to reach the decision after the lead; a row whose
    decision did not come by then (another tokenisation) is asked again in a second round
    with the full budget, so the verdict is never read from an unfinished decision."""

    def __init__(
        self,
        llm: Any,
        prompts: list[list[int]],
        job: DecodeJob,
        sampling: Any,
        leads: list[list[int]],
        readout: bool,
    ) -> None:
        self._llm, self._prompts, self._job, self._leads = llm, prompts, job, leads
        self._full = sampling
        first = sampling
        if readout:
            first = sampling.model_copy(
                update={"max_new_tokens": min(READOUT_STEPS, sampling.max_new_tokens)}
            )
        self._again = readout and first.max_new_tokens < sampling.max_new_tokens
        self.outputs: list[ConstrainedOutput] = []
        self._rows = list(range(len(prompts)))
        self._batch: Any = self._batch_for(self._rows, first)

    def _batch_for(self, rows: list[int], sampling: Any) -> Any:
        j = self._job
        return engine_batch(
            self._llm, [self._prompts[i] for i in rows], [j.schemas[i] for i in rows],
            [j.signal[i] for i in rows] if j.signal is not None else None, j.bias, sampling,
            [self._leads[i] for i in rows], [j.seeds[i] for i in rows] if j.seeds else None,
        )  # fmt: skip

    @property
    def done(self) -> bool:
        """Every row has its output."""
        return self._batch is None

    @property
    def requests(self) -> list[Any]:
        """This round's engine requests (none once ``done``)."""
        return [] if self._batch is None else list(self._batch.requests)

    def feed(self, results: Sequence[Any]) -> None:
        """This round's results (``EngineResult``s, one per request, in order)."""
        if self._batch is None:
            raise RuntimeError("the stage is done: nothing was asked")
        outs = self._batch.finish(results)
        if not self.outputs:
            self.outputs = outs
        else:
            for i, o in zip(self._rows, outs, strict=True):
                self.outputs[i] = o
        again = [i for i, o in enumerate(self.outputs)
                 if o.record is None or o.record.chosen is None] if self._again else []  # fmt: skip
        self._again = False
        self._rows = again
        self._batch = self._batch_for(again, self._full) if again else None


@dataclass(frozen=True)
class OptionJob:
    """Whole-option scoring: for each context (the tokens after the shared ``prefix``), the
    option of ``trie`` whose whole answer is most likely; ties go to the lower option index.

    Attributes:
        prefix: token ids every context follows (encoded once).
        contexts: per question, its token ids after ``prefix`` (never empty).
        trie: the options' token trie (``recjudge.llm.OptionTrie``).
        width: open paths expanded per batched forward.
    """

    prefix: Sequence[int]
    contexts: Sequence[Sequence[int]]
    trie: Any
    width: int = 16

    def __post_init__(self) -> None:
        if self.width < 1:
            raise ValueError("width must be >= 1")
        if any(not ctx for ctx in self.contexts):
            raise ValueError("empty context")


class CapabilityError(RunFault, ValueError):
    """A decode job asks for a promise its backend does not declare (``Capabilities``): a
    fault of the whole run (every request would be refused alike), never recorded per pair."""


def require(caps: Any, job: DecodeJob, backend: str = "this backend") -> None:
    """Refuse a job whose promises ``caps`` cannot keep, in one line, before anything is
    decoded (so nothing is stored under a key that claims them):

    - ``deterministic`` (bit-identical whatever the batch) needs ``batch_invariant``; an
      engine backend batches as it likes, so its answers would be stored keyed as
      deterministic without being so;
    - an ``explore`` hook (a sweep going on past a decision) needs ``step_scores``.

    ``rows``, ``head`` and ``draft`` are speed settings of recjudge's own engines, not
    promises about the answer: an engine backend has its own and ignores them.

    Raises:
        CapabilityError: naming the setting, the backend and what to do instead.
    """
    if job.deterministic and not caps.batch_invariant:
        raise CapabilityError(
            f"deterministic (batch-invariant) decoding was asked for, but {backend} does not "
            "declare it (its engine batches requests itself); drop --deterministic / "
            "deterministic=True, or use the transformers backend"
        )
    if job.explore is not None and not caps.step_scores:
        raise CapabilityError(
            f"a sweep's exploration needs per-step scores, which {backend} does not give (it "
            "decodes in its engine); judge each setting on its own"
        )


#: steps beyond the longest answer's bytes: the end-of-sequence token and a jump-forward lead
ANSWER_MARGIN = 8


def room_for_answers(sampling: Any, schemas: Sequence[Any]) -> Any:
    """``sampling`` with ``max_new_tokens`` raised, where it is below, to what the longest
    answer of ``schemas`` can take (``Schema.max_answer_bytes`` + ``ANSWER_MARGIN``), when
    every schema is made of listed strings only.

    Why: such a grammar is finite, so the budget can only cut an answer short, and a cut
    evidence list left a YES with no evidence (long titles: Book-Crossing's, or a catalogue
    that stuffs instructions into one). Answers that fit are the same token for token (the
    budget is never reached), so no stored key changes meaning.
    """
    bounds = [s.max_answer_bytes() for s in schemas]
    if not bounds or any(b is None for b in bounds):
        return sampling
    need = max(bounds) + ANSWER_MARGIN
    if need <= sampling.max_new_tokens:
        return sampling
    return sampling.model_copy(update={"max_new_tokens": need})


@overload
def decode(llm: LLMBackend, job: DecodeJob, *, stats: Any = None) -> list[ConstrainedOutput]: ...
@overload
def decode(llm: LLMBackend, job: OptionJob, *, stats: Any = None) -> list[BestOption]: ...
def decode(
    llm: LLMBackend, job: DecodeJob | OptionJob, *, stats: Any = None
) -> list[ConstrainedOutput] | list[BestOption]:
    """Decode ``job`` on ``llm`` by the path its capabilities call for; one output per row,
    in order: for a ``DecodeJob`` the text, parsed value where the grammar completed,
    decision record and tokens (``ConstrainedOutput``); for an ``OptionJob`` each context's
    best option (``recjudge.llm.BestOption``).

    Args:
        llm: a backend (``recjudge.llm.LLMBackend``).
        job: what to decode.
        stats: an ``EngineStats`` the engine adds its counts to.

    Raises:
        CapabilityError: the job asks for what the backend does not declare (``require``).
    """
    caps = capabilities_of(llm)
    name = getattr(llm, "name", type(llm).__name__)
    if isinstance(job, OptionJob):
        if not caps.option_scoring:
            raise CapabilityError(
                f"whole-option scoring was asked for, but {name} does not declare it (it needs "
                "a model the fast engine supports, or an engine with next-token "
                "log-probabilities); ask the question as constrained decoding instead"
            )
        return best_options(llm, job.prefix, job.contexts, job.trie, width=job.width,
                            stats=stats)  # fmt: skip
    require(caps, job, name)
    n = len(job.suffixes)
    if n == 0:
        return []
    sampling = room_for_answers(job.sampling or SamplingConfig(), job.schemas)
    grammar, proc = make_processors(llm, job.schemas, job.signal, job.bias)
    step, accept = _hooks(grammar, proc)
    leads = [lead_ids(llm, grammar, row) if job.jump_forward else [] for row in range(n)]
    for row, lead in enumerate(leads):
        for t in lead:
            accept(row, t)
    grouped = job.grouped()
    suffixes = [list(s) + lead for s, lead in zip(job.suffixes, leads, strict=True)]
    if caps.engine_constraints:
        return _on_engine(llm, job, grouped, suffixes, leads, sampling, proc, stats)
    if proc is not None:
        proc.explore = job.explore
    tokens = _on_local_engine(llm, job, grouped, suffixes, grammar, proc, step, accept,
                              sampling, stats)  # fmt: skip
    out = []
    for row, schema in enumerate(job.schemas):
        done = grammar.done(row)
        text = grammar.text(row) + ("" if done else grammar.jump_forward(row))
        out.append(ConstrainedOutput(
            text=text,
            value=schema.parse(grammar.text(row)) if done else None,
            record=proc.records[row] if proc is not None else None,
            token_ids=list(tokens[row]) if tokens is not None else [],
        ))  # fmt: skip
    return out


def engine_stage(llm: Any, job: DecodeJob, *, stats: Any = None) -> EngineStage:
    """``job`` as engine requests and the replay of their results (``EngineStage``), for
    an engine backend whose requests run elsewhere (``recjudge.llm.RayDataLLM``: the
    executor sends every call's requests through one Ray Data LLM stage). ``decode`` runs
    the same stage through ``llm.submit``; the two give the same outputs for the same
    results. ``llm`` holds the tokenizer the job was encoded with.

    Raises:
        CapabilityError: ``llm`` does not declare engine constraints, or the job asks for
            what it does not declare.
    """
    caps = capabilities_of(llm)
    name = getattr(llm, "name", type(llm).__name__)
    if not caps.engine_constraints:
        raise CapabilityError(f"{name} decodes in process: run the job with decode()")
    require(caps, job, name)
    sampling = room_for_answers(job.sampling or SamplingConfig(), job.schemas)
    grammar, proc = make_processors(llm, job.schemas, job.signal, job.bias)
    n = len(job.suffixes)
    leads = [lead_ids(llm, grammar, row) if job.jump_forward else [] for row in range(n)]
    suffixes = [list(s) + lead for s, lead in zip(job.suffixes, leads, strict=True)]
    return _stage(llm, job, job.grouped(), suffixes, leads, sampling, proc, stats)


def _on_engine(llm, job, grouped, suffixes, leads, sampling, proc, stats):
    """``decode`` on a backend whose engine applies the grammar and the bias: the job's
    ``EngineStage``, each round sent with ``llm.submit``."""
    stage = _stage(llm, job, grouped, suffixes, leads, sampling, proc, stats)
    if bias_probe_due(llm):
        probe_bias(llm)
    while not stage.done:
        stage.feed(llm.submit(stage.requests))
    return stage.outputs


def _stage(llm, job, grouped, suffixes, leads, sampling, proc, stats) -> EngineStage:
    """The job as engine requests: whole prompts (the shared prefix put back in front)."""
    prompts = [(grouped[0][grouped[1][i]] if grouped else []) + s for i, s in enumerate(suffixes)]
    if stats is not None:
        stats.prefill_tokens += sum(len(p) for p in prompts)
    readout = job.stop_at_decision and job.keep_branch is None and proc is not None
    return EngineStage(llm, prompts, job, sampling, leads, readout)


def _on_local_engine(llm, job, grouped, suffixes, grammar, proc, step, accept, sampling, stats):
    """``decode`` on recjudge's own engines (shared-prefix or per prompt): the tokens of
    each row, stopped at the decision when asked or when the rest is forced."""

    def finished(row: int) -> bool:
        if grammar.finish_forced(row):  # the rest is forced: no more model steps
            return True
        if not job.stop_at_decision or proc is None:
            return False
        chosen = proc.records[row].chosen
        return chosen is not None and chosen != job.keep_branch

    engine_job = EngineJob(
        step, accept, finished, sampling=sampling, seeds=job.seeds, stats=stats,
        rows=job.rows, deterministic=job.deterministic,
        # the LM head for the allowed columns only: the shared-prefix engine's option
        allowed=grammar.allowed if job.head == "allowed" and grouped is not None else None,
        draft=draft_ids(llm, grammar) if job.draft else None,
    )  # fmt: skip
    if grouped is None:
        return decode_prompts(llm, suffixes, engine_job)
    prefixes, prefix_of = grouped
    return decode_shared(llm, prefixes, prefix_of, suffixes, engine_job)
