"""The BRIEF judge and its ablations, batch scoring and resumable runs (``Judge``).

Beside it: its configuration (``reward._judge_config``), what it is asked and answers
(``reward._judgment``) and the requests built from a dataset (``reward._requests``)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np

from recjudge._registry import UnknownNameError
from recjudge._util import RunFault, json_part, stable_hash, stable_hash_encoded
from recjudge.decoding import DecodeJob, decode
from recjudge.llm import (
    LLMConfig,
    ModelLoadError,
    SamplingConfig,
    capabilities_of,
    escape_special,
    llm_key,
    loaded_config,
    resolution_state,
    resolve_llm_config,
)
from recjudge.reward._judge_config import JUDGES, JudgeConfig
from recjudge.reward._judgment import (
    RECORDED_ERRORS,
    DecodedCall,
    JudgeRequest,
    Judgment,
    RunSummary,
    error_text,
    is_run_fault,
    parsed_evidence,
)
from recjudge.reward._modes import SIMULATOR_MODES
from recjudge.reward._prompt import (
    CANDIDATE_SLOT,
    PROMPT_VERSION,
    HistoryItem,
    build_messages,
)
from recjudge.reward._requests import stored_request
from recjudge.reward._store import ResultsStore, StoreError, personas_path

if TYPE_CHECKING:
    from recjudge.llm import LLMBackend

log = logging.getLogger(__name__)


def clear_prefix_cache(llm: LLMBackend) -> None:
    """Forget ``llm``'s shared prefix caches (benchmarks time each method from a cold start)."""
    from recjudge.llm import prefixes_of

    prefixes_of(llm).clear()


_REQUIRED = ("user_id", "candidate_id", "mode", "is_relevant", "evidence", "p_yes", "raw_text")


def _stored(store: ResultsStore, key: str, row: dict[str, Any]) -> Judgment:
    """A stored result as a Judgment; a row that is not one is named, not guessed at."""
    missing = [f for f in _REQUIRED if f not in row]
    if missing:
        raise StoreError(
            f"results store {store.path}: the result stored under key {key!r} lacks "
            f"{missing}; it was not written by this version or was edited. Remove the store "
            "(or that row) and run again"
        )
    return Judgment.from_dict(row)


SIGMA_VERSION = 2  # 2: MF fold-in with confidence alpha*r, always from the request's history


def cf_identity(cf: Any) -> str | None:
    """A stable id for a CF model: its kind, config, training facts and sigma scale."""
    if cf is None:
        return None
    info = {
        k: v
        for k, v in getattr(cf, "train_info", {}).items()
        if k not in ("train_seconds", "epochs")
    }
    # SIGMA_VERSION: how sigma is computed from a saved model (fold-in, signal); results of
    # an older computation must not be reused for a newer one.
    return stable_hash(cf.name, cf.config.model_dump(), info, cf.scaler.state(), len(cf.items),
                       SIGMA_VERSION)  # fmt: skip


class Judge:
    """The BRIEF judge.

    Args:
        config: the judge's settings.
        llm: a loaded backend (loaded from ``config.model`` when needed and not given).
        cf: a CF model giving sigma (required by brief, non-adaptive, cf-only, item-item
            unless every request carries its own sigma). For item-item, a SASRec or MF model
            is wrapped in ``ItemItemSimilarity`` automatically.
        population: dataset facts the agent4rec and recagent simulators read
            (``Population.of(dataset)``).
        executor: where ``judge_many`` decodes the requests it has to judge (None: in this
            process). ``reward.RayExecutor`` judges them on a Ray cluster's actors; keys,
            sigma, the store and the counts stay here either way.
    """

    def __init__(
        self,
        config: JudgeConfig | None = None,
        llm: LLMBackend | None = None,
        cf: Any = None,
        population: Any = None,
        llm_config: LLMConfig | None = None,
        executor: JudgeExecutor | None = None,
    ) -> None:
        self.config = config or JudgeConfig()
        self.executor = executor
        # How to load the LLM when it is first needed (default: the config's model with every
        # LLMConfig default); ignored when ``llm`` is given.
        self._llm_config = llm_config
        JUDGES.get(self.config.mode)
        self.population = population
        self.simulator = None
        if self.config.mode in SIMULATOR_MODES:
            from recjudge.reward._simulators import SIMULATORS

            self.simulator = SIMULATORS.get(self.config.mode)()
            if self.simulator.needs_population and population is None:
                raise ValueError(
                    f"mode {self.config.mode!r} reads dataset facts (traits, user "
                    "attributes): pass population=Population.of(dataset)"
                )
        self._personas: dict[str, str] = {}  # persona texts by persona key
        self._history_memo: dict[int, tuple[list[HistoryItem], int, str]] = {}
        self._settings_memo: dict[bool, tuple[Any, str]] = {}
        if self.config.mode == "item-item" and cf is not None and cf.name != "item-item":
            from recjudge.cf_models import ItemItemSimilarity

            # Uncalibrated: the cosine range [-1, 1] maps to sigma as is. For a scale fitted
            # on validation pairs use cf_models.item_item_for(base, dataset).
            log.warning("item-item mode: wrapping %s without calibration", cf.name)
            base = cf
            cf = ItemItemSimilarity.from_model(base)
            cf.scaler = base.scaler.__class__(base.scaler.config)
            cf.scaler.low, cf.scaler.high = -1.0, 1.0
        self.cf = cf
        self._llm = llm
        self._cf_id = cf_identity(cf)
        from recjudge.llm import EngineStats

        self.stats = EngineStats()
        self.last_run: RunSummary | None = None

    @property
    def llm(self) -> Any:
        if self._llm is None:
            from recjudge.llm import load_llm

            try:
                self._llm = load_llm(self.llm_config_or_model())
            except UnknownNameError as e:  # a misspelt model: every request would fail alike
                raise ModelLoadError(str(e).strip("'\"")) from None
        return self._llm

    def warm_up(self) -> None:
        """Load the LLM and build its grammar token table now (both are otherwise built by
        the first judgment). Safe to run in a background thread while the caller loads data:
        a cold CLI judgment overlaps the two."""
        if not self.config.uses_llm() or self.executor is not None:  # (its workers load it)
            return
        from recjudge.decoding import GRAMMARS

        llm = self.llm
        if not capabilities_of(llm).engine_constraints:
            GRAMMARS.table(llm.tokenizer, llm.vocab_size)

    def llm_loaded_here(self) -> bool:
        """Whether this judge was given (or has loaded) its LLM in this process."""
        return self._llm is not None

    def llm_config_or_model(self) -> LLMConfig | str:
        """How the LLM is (to be) loaded: the ``llm_config`` given, else the config's model."""
        return self._llm_config or self.config.model

    # -- keys -----------------------------------------------------------------------------
    def _llm_settings(self) -> dict[str, Any]:
        """What of the LLM changes an answer (``llm_key``), for the LLM this judge runs (or
        will load, or its workers will load). Computed once per state (LLM loaded or not,
        ``resolution_state``), not per key: resolving it was over half of a key's cost."""
        state = (self._llm is None, *resolution_state())
        cached = self.__dict__.get("_llm_settings_cache")
        if cached is not None and cached[0] == state:
            return cached[1]
        llm_config = loaded_config(self._llm)
        if llm_config is None:  # not loaded yet: what load_llm will use
            llm_config = resolve_llm_config(self.llm_config_or_model())
        if self.executor is not None and self._llm is None:  # what its workers will load
            llm_config = self.executor.placed(llm_config)
        out = llm_key(llm_config)
        self._llm_settings_cache = (state, out)
        return out

    def key(self, req: JudgeRequest) -> str:
        return self._key(req, bias=True)

    def decision_key(self, req: JudgeRequest) -> str:
        """The key of this request's unbiased decision record (``reward.judge_sweep``):
        ``key`` without what only acts at or after the decision (mode, beta, CF model,
        sigma, threshold, evidence), so every sweepable setting shares it."""
        return self._key(req, bias=False)

    def _settings_json(self, bias: bool) -> str:
        """The key's settings part, encoded once while the LLM's settings stay (the config is
        frozen; ``_llm_settings`` gives a new object when what it reads changes)."""
        llm = self._llm_settings()
        got = self._settings_memo.get(bias)
        if got is not None and got[0] is llm:
            return got[1]
        c = self.config
        keyed = set(c.KEYED)  # JudgeConfig classifies every field (see there)
        if c.deterministic:
            keyed.add("decode_rows")
        if self.simulator is not None:  # their role text is in the key below too
            keyed.add("persona_tokens")
        if not bias:
            keyed -= c.AFTER_DECISION
        settings = c.model_dump(include=keyed) | llm
        # The one sampling key (SamplingConfig.key): greedy ignores the warpers and the seed
        # and decodes once, so those and ``samples`` enter a greedy key at their defaults.
        settings["sampling"] = c.sampling.key()
        settings["samples"] = c.samples if c.sampling.do_sample else 1
        if "decode_rows" in keyed:  # None runs (and so keys) as the invariant engine's 8
            settings["decode_rows"] = c.rows()
        enc = json_part(settings)
        self._settings_memo[bias] = (llm, enc)
        return enc

    def _key(self, req: JudgeRequest, bias: bool) -> str:
        signal = (self._cf_id if req.sigma is None else None, req.sigma) if bias else ()
        # = stable_hash(PROMPT_VERSION, ["decision"], settings, *signal, user, candidate id
        # and text, [(item, text, rating) per history item], [role]), the settings and the
        # history encoded once (a user's candidates share a history: most of a key's cost)
        head = [PROMPT_VERSION, *([] if bias else ["decision"])]
        parts = [*signal, req.user_id, req.candidate_id, req.candidate_text]
        return stable_hash_encoded(
            [
                json_part(head)[1:-1],  # a list's items joined as the whole list joins them
                self._settings_json(bias),
                json_part(parts)[1:-1],
                self._history_json(req.history),
                *([json_part(self._role(req))] if self.simulator is not None else []),
            ],
            length=32,
        )

    #: histories whose key encoding is kept (a bound, not a tuning: one batch's users)
    HISTORY_MEMO = 4096

    def _history_json(self, history: list[HistoryItem]) -> str:
        """The key's encoding of a history, kept per history list: requests built together
        share one list per user (``requests_for``). The list itself is held with its length,
        so an entry answers only for that very list, unchanged in length (a list is never
        edited in place here: requests are rebuilt, not mutated)."""
        got = self._history_memo.get(id(history))
        if got is not None and got[0] is history and got[1] == len(history):
            return got[2]
        enc = json_part([(h.item_id, h.text, h.rating) for h in history])
        if len(self._history_memo) >= self.HISTORY_MEMO:
            self._history_memo.clear()
        self._history_memo[id(history)] = (history, len(history), enc)
        return enc

    # -- personas (user simulators) ---------------------------------------------------------
    def _persona_key(self, req: JudgeRequest) -> str:
        from recjudge.reward._simulators import persona_key

        assert self.simulator is not None
        settings = {"model": self.config.model, **self._llm_settings()}
        return persona_key(self.simulator, req, settings, self.config.max_history)

    def persona(self, req: JudgeRequest) -> str:
        """The simulator's persona of this request's user (written by ``prepare_personas``
        when missing)."""
        key = self._persona_key(req)
        if key not in self._personas:
            self.prepare_personas([req])
        return self._personas[key]

    def _role(self, req: JudgeRequest) -> dict[str, str]:
        """The simulator's system message (persona, traits, attributes) and question; part
        of the judgment key, so a changed persona or population is judged anew."""
        assert self.simulator is not None
        system = self.simulator.system(self.persona(req), req.user_id, req.history,
                                       self.population)  # fmt: skip
        return {"system": system, "question": self.simulator.question}

    def prepare_personas(
        self, reqs: Sequence[JudgeRequest], store: ResultsStore | None = None, progress=False
    ) -> None:
        """Write (or read back from ``store``) the persona of every distinct user history."""
        from recjudge.reward._simulators import persona_asks
        from recjudge.reward._stored import generate_stored

        assert self.simulator is not None
        c = self.config
        settings = {"model": c.model, **self._llm_settings()}
        asks = persona_asks(self.simulator, reqs, self.population, settings, c.max_history)
        missing = [a for a in asks if a.key not in self._personas]
        if not missing:
            return
        sampling = SamplingConfig(max_new_tokens=c.persona_tokens)

        def write(personas: ResultsStore) -> None:
            got = generate_stored(
                self.llm,
                personas,
                missing,
                sampling=sampling,
                # whole prompts, no shared prefix: 8 at a time unless told (their memory)
                batch_size=c.batch_size or 8,
                desc="personas",
                progress=progress,
            )
            self._personas.update({k: v["text"] for k, v in got.items()})

        if store is None:  # the texts are kept on this judge; the store is only the loop's
            with ResultsStore(":memory:") as personas:
                write(personas)
        else:  # next to the judgments' store, never in it (its rows are all judgments)
            with ResultsStore(personas_path(store.path)) as personas:
                write(personas)

    # -- sigma ------------------------------------------------------------------------------
    def sigma_for(self, req: JudgeRequest) -> float | None:
        if req.sigma is not None:
            if not np.isfinite(req.sigma):
                raise ValueError(f"request {req.user_id}/{req.candidate_id}: sigma is not finite")
            return float(np.clip(req.sigma, -1.0, 1.0))
        if not self.config.uses_cf():
            return None
        if self.cf is None:
            raise ValueError(
                f"mode {self.config.mode!r} needs a CF model (or a sigma per "
                "request); pass cf=... or --cf DIR"
            )
        return self.cf.sigma([h.item_id for h in req.history], req.candidate_id, req.user_id)

    def sigmas_for(self, reqs: Sequence[JudgeRequest]) -> list[float | None | Exception]:
        """``sigma_for`` of every request, in order, the CF model scored once per user and
        history (requests for one user's candidates share it: one ``score_history`` instead
        of one per pair). A request whose sigma fails comes back as its exception."""

        def one(r: JudgeRequest) -> float | None | Exception:
            try:
                return self.sigma_for(r)
            except RunFault:
                raise
            except RECORDED_ERRORS as e:
                return e

        out: list[float | None | Exception] = [None] * len(reqs)
        groups: dict[tuple[str, tuple[str, ...]], list[int]] = {}
        for n, r in enumerate(reqs):
            if r.sigma is not None or not self.config.uses_cf() or self.cf is None:
                out[n] = one(r)
            else:
                groups.setdefault((r.user_id, tuple(h.item_id for h in r.history)), []).append(n)
        for (user, hist), idx in groups.items():
            try:
                got = self.cf.sigmas(list(hist), [reqs[n].candidate_id for n in idx], user)
            except RunFault:
                raise
            except RECORDED_ERRORS:  # pair by pair, so that only the failing ones fail
                for n in idx:
                    out[n] = one(reqs[n])
                continue
            for n, v in zip(idx, got.tolist(), strict=True):
                out[n] = float(v)
        return out

    # -- judging ------------------------------------------------------------------------
    def judge(self, req: JudgeRequest) -> Judgment:
        return self.judge_many([req])[0]

    def judge_many(
        self,
        reqs: Sequence[JudgeRequest],
        store: ResultsStore | None = None,
        progress: bool = False,
        on_batch: Callable[[int], None] | None = None,
        errors: Literal["raise", "record"] = "raise",
        retry_failed: bool = True,
    ) -> list[Judgment]:
        """Judge many requests; results come back in input order.

        A result is the same alone or in a batch up to floating-point rounding (bf16 kernels
        block by row count; ``deterministic``: bit-identical). Several users' requests share
        a call (``batches``). With ``store``, finished keys are read back instead of
        recomputed, and each batch is written in one transaction.

        Args:
            errors: ``raise``: the first failing request ends the run (finished batches are
                in the store). ``record``: a request that fails (a ``RECORDED_ERRORS`` error
                while building its prompt or decoding it) comes back as a Judgment with
                ``error`` set and no verdict, is written to the store's failures, and the run
                goes on; a batch that fails is retried request by request so only the
                failing ones are lost. Errors of the whole run (damaged weights giving NaN
                logits, an unreachable server, missing packages) still end it.
            retry_failed: with a store, judge again the requests whose failure it recorded
                (False: return those failures as they are).
        """
        if self.simulator is not None:
            self.prepare_personas(reqs, store, progress)
        keys = [self.key(r) for r in reqs]
        results, retried = self._reuse(reqs, keys, store, retry_failed)
        reused = len(results)
        imported = len(store.imported(list(results))) if store is not None and results else 0
        todo = _first_of_each_missing(keys, results)
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(reqs), initial=len(reqs) - len(todo), desc="judge", unit="pair")
        for batch, judged in self._stream(reqs, keys, todo, errors == "record"):
            for i, j in zip(batch, judged, strict=True):
                if isinstance(j, Exception):
                    j = self.failure(reqs[i], error_text(j), keys[i])
                j.key = keys[i]
                results[keys[i]] = j
            if store is not None:
                self.persist(store, [(reqs[i], results[keys[i]]) for i in batch])
            if bar is not None:
                bar.update(len(batch))
            if on_batch is not None:
                on_batch(len(batch))
        if bar is not None:
            bar.close()
        out = [results[k] for k in keys]
        self.last_run = RunSummary(
            requests=len(reqs),
            reused=reused,
            imported=imported,
            judged=len(todo),
            failed=sum(j.error is not None for j in out),
            retried_faults=retried,
            workers=self.executor.workers() if self.executor is not None and todo else {},
        )
        return out

    def _stream(
        self, reqs: Sequence[JudgeRequest], keys: list[str], todo: list[int], record: bool
    ) -> Iterator[tuple[list[int], list[Judgment | Exception]]]:
        """Where ``todo`` is decoded: the executor (a Ray cluster) when there is one and the
        mode uses the LLM, else this process; (indices, results) per engine call."""
        if self.executor is None or not todo or not self.config.uses_llm():
            return self._judge_here(reqs, todo, record)
        if self.simulator is not None:
            raise ValueError(
                f"mode {self.config.mode!r} writes a persona per user first; judge it "
                "in one process (without --ray)"
            )
        return self.executor.run(self, reqs, keys, todo, record)

    def _judge_here(
        self, reqs: Sequence[JudgeRequest], todo: list[int], record: bool
    ) -> Iterator[tuple[list[int], list[Judgment | Exception]]]:
        """Judge ``todo`` in this process, one engine call at a time: (indices, results)."""
        unprompted: dict[int, Exception] = {}
        batches = self.batches(reqs, todo, unprompted if record else None)
        if unprompted:
            batches.insert(0, sorted(unprompted))
        for batch in batches:
            if batch and batch[0] in unprompted:
                yield batch, [unprompted[i] for i in batch]
            else:
                yield batch, self._judge_isolating([reqs[i] for i in batch], record)

    def judge_prepared(
        self,
        reqs: Sequence[JudgeRequest],
        keys: Sequence[str],
        sigmas: Sequence[float | None],
        record: bool = True,
    ) -> list[Judgment | Exception]:
        """Judge one engine call's requests whose keys and sigma were computed elsewhere
        (by the judge that owns the CF model and the store: ``RayExecutor``'s workers run
        this). The same decoding as ``judge_many``'s, with the same sampling seeds (from
        ``keys``); with ``record`` a failing request comes back as its exception, and a
        fault of the whole run (``RunFault``) is raised."""
        given = {id(r): (k, s) for r, k, s in zip(reqs, keys, sigmas, strict=True)}
        return self._judge_isolating(list(reqs), record, given)

    def plan(
        self, reqs: Sequence[JudgeRequest], todo: Sequence[int], spread: int = 1
    ) -> list[list[int]]:
        """The engine calls ``judge_many`` would make for ``todo``, planned without the
        model: up to ``batch()`` requests each, one prompt group (``prompt_group``) kept
        together, groups packed into a call while they fit, in order of first appearance.
        ``batches`` makes the same calls from the tokenised prefixes (so a distributed run
        decodes the same batches as one process) except where two different histories
        render to one prefix.

        ``spread``: the calls wanted at least, for as many workers. Where packing gives
        fewer, groups are packed only up to ``ceil(len(todo) / spread)`` requests a call
        (a group is still never split below ``batch()``), so a small run of many users
        reaches every worker; it never changes a result (``batch_size`` does not)."""
        size = self.config.batch()
        fill = max(1, -(-len(todo) // max(spread, 1)))
        if not self.config.uses_llm():
            size = min(size, fill) if -(-len(todo) // size) < spread else size
            return [list(todo[b : b + size]) for b in range(0, len(todo), size)]
        groups: dict[Any, list[int]] = {}
        for i in todo:
            groups.setdefault(self.prompt_group(reqs[i]), []).append(i)
        calls = _pack(groups.values(), size)
        if len(calls) < spread:
            calls = _pack(groups.values(), size, fill)
        return calls

    def prompt_group(self, req: JudgeRequest) -> Any:
        """What a request's prompt prefix is made of besides the judge's settings: its
        history's most recent ``max_history`` items and the domain (the candidate is in the
        suffix). Requests with equal groups share one prefix, encoded once."""
        domain = self.config.domain or req.domain
        # the prompt shows the most recent max_history items at most (build_messages): two
        # histories that agree on those render one prefix
        shown = req.history[-self.config.max_history :]
        return (domain, tuple((h.item_id, h.title, h.text, h.rating) for h in shown))

    def _reuse(
        self,
        reqs: Sequence[JudgeRequest],
        keys: list[str],
        store: ResultsStore | None,
        retry_failed: bool,
    ) -> tuple[dict[str, Judgment], int]:
        """The judgments ``store`` already holds for ``keys`` (and, without ``retry_failed``,
        its recorded failures), with the request's ids filled in where a row has none; and
        how many recorded failures are judged again although ``retry_failed`` is off: those
        whose error was a fault of the whole run (``is_run_fault``: a model not installed
        then, a server down), which an earlier version recorded per pair and the user has
        presumably fixed since."""
        done = store.get_many(keys) if store is not None else {}
        results: dict[str, Judgment] = {k: _stored(store, k, v) for k, v in done.items()}
        for i, k in enumerate(keys):  # a row imported from a checkpoint has no ids
            if k in results and results[k].user_id is None:
                results[k] = replace(
                    results[k], user_id=reqs[i].user_id, candidate_id=reqs[i].candidate_id
                )
        retried = 0
        if store is not None and not retry_failed:
            old = store.failures([k for k in keys if k not in results])
            faults = {k for k, e in old.items() if is_run_fault(e)}
            retried = len(faults)
            for i, k in enumerate(keys):
                if k in old and k not in results and k not in faults:
                    results[k] = self.failure(reqs[i], old[k], k)
        return results, retried

    def persist(self, store: ResultsStore, done: list[tuple[JudgeRequest, Judgment]]) -> None:
        """One transaction: the verdicts as results, the failures (no verdict) as failures."""
        store.put_many(
            [(j.key, stored_request(r, self.config), j.to_dict()) for r, j in done
             if j.error is None],
            [(j.key, stored_request(r, self.config), j.error) for r, j in done
             if j.error is not None],
        )  # fmt: skip

    def _judge_isolating(
        self, reqs: list[JudgeRequest], record: bool, given: dict[int, Any] | None = None
    ) -> list[Judgment | Exception]:
        """Judge a batch; with ``record``, a failing batch is retried request by request and
        each request that still fails comes back as its exception. ``given``: precomputed
        (key, sigma) by ``id`` of the request (``judge_prepared``)."""
        try:
            return list(self._judge_batch(reqs, given))
        except RunFault:  # NonFiniteLogitsError among them
            raise  # the model, device or server is broken: every request would fail the same way
        except RECORDED_ERRORS as e:
            if not record:
                raise
            if len(reqs) == 1:
                log.warning("user %r, candidate %r failed: %s", reqs[0].user_id,
                            reqs[0].candidate_id, e)  # fmt: skip
                return [e]
            return [self._judge_isolating([r], record, given)[0] for r in reqs]

    def failure(self, req: JudgeRequest, error: str, key: str) -> Judgment:
        """A failed judgment: no verdict (p_yes NaN, so no average silently includes it)."""
        return Judgment(
            req.user_id, req.candidate_id, self.config.mode, False, [], float("nan"), None,
            None, 0.0, 0.0, "", key=key, error=error,
        )  # fmt: skip

    def batches(
        self,
        reqs: Sequence[JudgeRequest],
        todo: list[int],
        failed: dict[int, Exception] | None = None,
    ) -> list[list[int]]:
        """The engine calls: up to ``batch()`` requests each, the requests of one prompt
        prefix (same user and history) kept together, several users' groups packed into one
        call while they fit (the fast engine decodes them in the same steps, each prefix
        encoded once). With ``failed``, a request whose prompt cannot be built goes there
        instead."""
        if not self.config.uses_llm():  # no prompt: nothing to group by
            return self.plan(reqs, todo)
        groups: dict[tuple[int, ...], list[int]] = {}
        for i in todo:
            try:
                prefix = tuple(self.prompt_ids(reqs[i])[1])
            except RunFault:
                raise
            except RECORDED_ERRORS as e:
                if failed is None:
                    raise
                failed[i] = e
                continue
            groups.setdefault(prefix, []).append(i)
        return _pack(groups.values(), self.config.batch())

    def prompt_ids(self, req: JudgeRequest) -> tuple[Any, list[int], list[int]]:
        """(rendered prompt, prefix ids, suffix ids); the prefix is shared by every candidate
        judged against the same history, the suffix holds the candidate."""
        cache = getattr(self, "_prompt_cache", None)
        if cache is None:
            cache = self._prompt_cache = {}
        k = id(req)
        if k in cache and cache[k][0] is req:
            return cache[k][1:]
        c = self.config
        tok = self.llm.tokenizer

        def count(lines: list[str]) -> list[int]:
            return [len(x) for x in tok(lines, add_special_tokens=False)["input_ids"]]

        role = self._role(req) if self.simulator is not None else {}
        rendered = build_messages(
            req.history,
            CANDIDATE_SLOT,
            **role,
            domain=c.domain or req.domain,
            evidence=not c.plain_verdict(),
            rating_scale=c.rating_scale if c.show_ratings else None,
            count_tokens=count,
            token_budget=c.token_budget,
            max_items=c.max_history,
        )
        text = self.llm.chat_prompt(rendered.messages)
        head, slot, tail = text.partition(" " + CANDIDATE_SLOT)
        if not slot:
            raise RuntimeError("the chat template moved the candidate slot; cannot split")
        prefix = self.llm.encode(head)
        candidate = escape_special(self.llm.tokenizer, req.candidate_text)
        suffix = self.llm.encode(" " + candidate + tail)
        if len(cache) > 4096:
            cache.clear()
        cache[k] = (req, rendered, prefix, suffix)
        return rendered, prefix, suffix

    def prompt_text(self, req: JudgeRequest) -> str:
        """The full prompt as the model sees it (prefix + suffix tokens decoded)."""
        _, prefix, suffix = self.prompt_ids(req)
        return self.llm.tokenizer.decode(prefix + suffix)

    def _judge_batch(
        self, reqs: list[JudgeRequest], given: dict[int, Any] | None = None
    ) -> list[Judgment]:
        c = self.config
        if given is not None:
            sigmas = [given[id(r)][1] for r in reqs]
        else:
            sigmas = self.sigmas_for(reqs)
            failed = next((s for s in sigmas if isinstance(s, Exception)), None)
            if failed is not None:
                raise failed
        if not c.uses_llm():
            out = []
            for r, s in zip(reqs, sigmas, strict=True):
                out.append(
                    Judgment(
                        r.user_id,
                        r.candidate_id,
                        c.mode,
                        bool(s > c.cf_threshold),
                        [],
                        (s + 1) / 2,
                        None,
                        s,
                        0.0,
                        0.0,
                        "",
                        history_shown=len(r.history),
                    )
                )
            return out
        keys = [given[id(r)][0] for r in reqs] if given is not None else None
        d = self.decode_batch(reqs, sigmas, keys=keys)
        return [self._judgment(r, d, i) for i, r in enumerate(reqs)]

    def decode_batch(
        self,
        reqs: list[JudgeRequest],
        sigmas: list[float | None],
        explore: Any = None,
        keys: list[str] | None = None,
    ) -> DecodedCall:
        """Grammar- and bias-constrained decoding of one call's requests, one or several
        prompt prefixes (``explore``: see ``BranchBiasProcessor.explore``; local engines
        only)."""
        c = self.config
        rendered, suffixes, schemas, which = [], [], [], []
        prefixes: dict[tuple[int, ...], int] = {}
        for r in reqs:
            rp, prefix, suffix = self.prompt_ids(r)
            rendered.append(rp)
            suffixes.append(suffix)
            schemas.append(c.schema_for(rp))
            which.append(prefixes.setdefault(tuple(prefix), len(prefixes)))
        n = c.samples if c.sampling.do_sample else 1
        rows = [i for i in range(len(reqs)) for _ in range(n)]
        keys = keys if keys is not None else [self.key(r) for r in reqs]
        seeds = [c.sampling.seed + s + int(keys[i][:8], 16) for i in range(len(reqs))
                 for s in range(n)]  # fmt: skip
        bias = c.branch_bias()
        row_schemas = [schemas[i] for i in rows]
        row_sigmas = [0.0 if sigmas[i] is None else sigmas[i] for i in rows]
        job = DecodeJob(
            suffixes=[suffixes[i] for i in rows],
            schemas=row_schemas,
            prefixes=[list(p) for p in prefixes],
            prefix_of=[which[i] for i in rows],
            signal=row_sigmas,
            bias=bias,
            sampling=c.sampling,
            seeds=seeds,
            # The answer opens with a forced key: prefill its canonical tokens with the
            # candidate; the model still produces the merged decision tokens (' ["', ' []').
            jump_forward=c.jump_forward_prefix,
            # A read-out stops at the decision; a judgment that must cite evidence keeps
            # writing it after YES.
            stop_at_decision=True,
            keep_branch="YES" if c.need_evidence and not c.plain_verdict() else None,
            rows=c.rows(),
            deterministic=c.deterministic,
            head="allowed",
            explore=explore,
        )
        outs = decode(self.llm, job, stats=self.stats)
        records = [o.record for o in outs]
        texts = [o.text for o in outs]
        return DecodedCall(rendered, schemas, sigmas, rows, records, texts)

    def _judgment(self, r: JudgeRequest, d: DecodedCall, i: int) -> Judgment:
        """Request ``i`` of a decoded batch as a Judgment (majority over its samples)."""
        my_rows = [k for k, ri in enumerate(d.rows) if ri == i]
        n = len(my_rows)
        rec = d.records[my_rows[0]]
        text = d.texts[my_rows[0]]
        verdicts = [d.records[k].chosen for k in my_rows]
        is_yes = verdicts[0] == "YES" if n == 1 else sum(v == "YES" for v in verdicts) * 2 > n
        p_yes = rec.p_yes_after if n == 1 else sum(v == "YES" for v in verdicts) / n
        evidence = parsed_evidence(d.schemas[i], text)
        ids = {h.title: h.item_id for h in d.rendered[i].shown}
        return Judgment(
            user_id=r.user_id,
            candidate_id=r.candidate_id,
            mode=self.config.mode,
            is_relevant=bool(is_yes),
            evidence=evidence,
            evidence_ids=[ids[t] for t in evidence],
            p_yes=float(p_yes if p_yes is not None else 0.0),
            p_yes_semantic=rec.p_yes_before,
            sigma=d.sigmas[i],
            delta=rec.delta_yes,
            entropy=rec.entropy,
            raw_text=text,
            decision_steps=rec.decision_steps,
            history_shown=len(d.rendered[i].shown),
            history_dropped=d.rendered[i].dropped,
            samples_yes=sum(v == "YES" for v in verdicts) if n > 1 else None,
        )


def _first_of_each_missing(keys: Sequence[str], have: Mapping[str, Any]) -> list[int]:
    """The index of each key's first request, for keys ``have`` does not hold (a key asked
    twice in one run is judged once)."""
    todo: list[int] = []
    pending: set[str] = set()
    for i, k in enumerate(keys):
        if k not in have and k not in pending:
            pending.add(k)
            todo.append(i)
    return todo


def _pack(groups: Any, size: int, fill: int | None = None) -> list[list[int]]:
    """Engine calls of at most ``size`` requests from groups of request indices: a group is
    split into chunks of ``size``, consecutive chunks share a call while it holds at most
    ``fill`` requests (default ``size``)."""
    fill = size if fill is None else min(fill, size)
    calls: list[list[int]] = []
    for g in groups:
        for b in range(0, len(g), size):
            chunk = g[b : b + size]
            if calls and len(calls[-1]) + len(chunk) <= fill:
                calls[-1].extend(chunk)
            else:
                calls.append(list(chunk))
    return calls


class JudgeExecutor(Protocol):
    """Where ``Judge.judge_many`` decodes the requests it has to judge.

    ``run`` yields, for each finished engine call, the indices into ``reqs`` it judged and
    their results in the same order (a ``Judgment``, or with ``record`` the exception of a
    request that failed); the judge writes each to its store as it arrives. A fault of the
    whole run is raised. Every index of ``todo`` is yielded once.
    """

    def run(
        self,
        judge: Judge,
        reqs: Sequence[JudgeRequest],
        keys: Sequence[str],
        todo: list[int],
        record: bool,
    ) -> Iterator[tuple[list[int], list[Judgment | Exception]]]: ...

    def placed(self, llm_config: LLMConfig) -> LLMConfig:
        """The LLM config its workers load for ``llm_config`` (dtype and device resolved):
        the judge keys its results with it."""
        ...

    def workers(self) -> dict[str, int]:
        """Pairs each of its workers judged in the last ``run`` (by worker name)."""
        ...
