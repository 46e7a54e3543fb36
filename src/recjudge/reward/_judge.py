"""The BRIEF judge and its ablations, batch scoring and resumable runs (``Judge``).

Beside it: its configuration (``reward._judge_config``), what it is asked and answers
(``reward._judgment``), its keys (``reward._keys``), sigma (``reward._sigma``), the plan of a
run (``reward._plan``), one engine call (``reward._call``) and a simulator's personas
(``reward._personas``)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol

from tqdm.auto import tqdm

from recjudge._registry import UnknownNameError
from recjudge._util import stable_hash
from recjudge.cf_models import ItemItemSimilarity
from recjudge.decoding import GRAMMARS
from recjudge.llm import (
    EngineStats,
    LLMConfig,
    ModelLoadError,
    capabilities_of,
    former_llm_keys,
    llm_key,
    load_llm,
    loaded_config,
    prefixes_of,
    resolution_state,
    resolve_llm_config,
)
from recjudge.reward._call import Role, decode_call, judge_call, prompts_for
from recjudge.reward._eta import WorkAhead
from recjudge.reward._judge_config import JUDGES, JudgeConfig
from recjudge.reward._judgment import DecodedCall, JudgeRequest, Judgment, RunSummary, error_text
from recjudge.reward._keys import JudgeKeys
from recjudge.reward._modes import SIMULATOR_MODES
from recjudge.reward._personas import Personas
from recjudge.reward._plan import JudgePlan
from recjudge.reward._requests import stored_request
from recjudge.reward._sigma import sigma_for, sigmas_for
from recjudge.reward._simulators import SIMULATORS
from recjudge.reward._store import ResultsStore

if TYPE_CHECKING:
    from recjudge.llm import LLMBackend
    from recjudge.reward._call import Prompt
    from recjudge.reward._personas import Personas

log = logging.getLogger(__name__)


def clear_prefix_cache(llm: LLMBackend) -> None:
    """Forget ``llm``'s shared prefix caches (benchmarks time each method from a cold start)."""
    prefixes_of(llm).clear()


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
            process). ``distributed.RayExecutor`` judges them on a Ray cluster's actors; keys,
            sigma, the plan, the store and the counts stay here either way.
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
        self.personas: Personas | None = None  # a user simulator's (SIMULATOR_MODES)
        if self.config.mode in SIMULATOR_MODES:
            simulator = SIMULATORS.get(self.config.mode)()
            if simulator.needs_population and population is None:
                raise ValueError(
                    f"mode {self.config.mode!r} reads dataset facts (traits, user "
                    "attributes): pass population=Population.of(dataset)"
                )
            self.personas = Personas(simulator, population, self.config, lambda: self.llm,
                                     self._llm_settings)  # fmt: skip
        if self.config.mode == "item-item" and cf is not None and cf.name != "item-item":
            # Uncalibrated: the cosine range [-1, 1] maps to sigma as is. For a scale fitted
            # on validation pairs use cf_models.item_item_for(base, dataset).
            log.warning("item-item mode: wrapping %s without calibration", cf.name)
            base = cf
            cf = ItemItemSimilarity.from_model(base)
            cf.scaler = base.scaler.__class__(base.scaler.config)
            cf.scaler.low, cf.scaler.high = -1.0, 1.0
        self.cf = cf
        self._llm = llm
        self.keys = JudgeKeys(self.config, cf_identity(cf), self._llm_settings, self.role,
                              self._former_llm_settings)  # fmt: skip

        self.stats = EngineStats()
        self.last_run: RunSummary | None = None

    @property
    def simulator(self) -> Any:
        """The user simulator of a simulator mode (None for the judge modes)."""
        return self.personas.simulator if self.personas is not None else None

    @property
    def role(self) -> Role | None:
        """What a request is asked in: a user simulator's role text (``Personas.role``); None
        for the judge modes. Part of the prompt, its prefix group and the key."""
        return self.personas.role if self.personas is not None else None

    @property
    def llm(self) -> Any:
        if self._llm is None:
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

        llm = self.llm
        if not capabilities_of(llm).engine_constraints:
            GRAMMARS.table(llm.tokenizer, llm.vocab_size)

    def llm_loaded_here(self) -> bool:
        """Whether this judge was given (or has loaded) its LLM in this process."""
        return self._llm is not None

    def llm_config_or_model(self) -> LLMConfig | str:
        """How the LLM is (to be) loaded: the ``llm_config`` given, else the config's model."""
        return self._llm_config or self.config.model

    def _llm_settings(self) -> dict[str, Any]:
        """What of the LLM changes an answer (``llm_key``), for the LLM this judge runs (or
        will load, or its workers will load). Computed once per state (LLM loaded or not,
        ``resolution_state``), not per key: resolving it was over half of a key's cost."""
        return self._keyed_llm()[0]

    def _former_llm_settings(self) -> list[dict[str, Any]]:
        """``_llm_settings``' earlier forms (``llm.former_llm_keys``)."""
        return self._keyed_llm()[1]

    def _keyed_llm(self) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        state = (self._llm is None, *resolution_state())
        cached = self.__dict__.get("_llm_settings_cache")
        if cached is not None and cached[0] == state:
            return cached[1]
        llm_config = loaded_config(self._llm)
        if llm_config is None:  # not loaded yet: what load_llm will use
            llm_config = resolve_llm_config(self.llm_config_or_model())
        if self.executor is not None and self._llm is None:  # what its workers will load
            llm_config = self.executor.placed(llm_config)
        out = (llm_key(llm_config), former_llm_keys(llm_config))
        self._llm_settings_cache = (state, out)
        return out

    def key(self, req: JudgeRequest) -> str:
        """The request's result key (``reward._keys``)."""
        return self.keys.key(req)

    def decision_key(self, req: JudgeRequest) -> str:
        """The key of this request's unbiased decision record (``reward.judge_sweep``):
        ``key`` without what only acts at or after the decision (mode, beta, CF model,
        sigma, threshold, evidence), so every sweepable setting shares it."""
        return self.keys.key(req, bias=False)

    def persona(self, req: JudgeRequest) -> str:
        """The simulator's persona of this request's user (written when missing)."""
        assert self.personas is not None, f"mode {self.config.mode!r} writes no persona"
        return self.personas.persona(req)

    def sigma_for(self, req: JudgeRequest) -> float | None:
        """The request's sigma (``reward._sigma.sigma_for``)."""
        return sigma_for(self.config, self.cf, req)

    def sigmas_for(self, reqs: Sequence[JudgeRequest]) -> list[float | None | Exception]:
        """``sigma_for`` of every request, the CF model scored once per user and history; a
        request whose sigma fails comes back as its exception."""
        return sigmas_for(self.config, self.cf, reqs, self.sigma_for)

    def prompt_ids(self, req: JudgeRequest) -> tuple[Any, list[int], list[int]]:
        """(rendered prompt, prefix ids, suffix ids); the prefix is shared by every candidate
        judged against the same history, the suffix holds the candidate."""
        p = self.prompts([req])[0]
        return p.rendered, p.prefix, p.suffix

    def prompts(self, reqs: Sequence[JudgeRequest]) -> list[Prompt]:
        """The requests' prompts, each prompt prefix rendered once (``reward._call``)."""
        return prompts_for(self.config, self.llm, reqs, self.role)  # type: ignore[return-value]

    def prompt_text(self, req: JudgeRequest) -> str:
        """The full prompt as the model sees it (prefix + suffix tokens decoded)."""
        _, prefix, suffix = self.prompt_ids(req)
        return self.llm.tokenizer.decode(prefix + suffix)

    def decode_batch(
        self, reqs: list[JudgeRequest], sigmas: list[float | None], explore: Any = None
    ) -> DecodedCall:
        """Decode one call's requests (``reward._call.decode_call``), keyed as judged."""
        keys = [self.key(r) for r in reqs]
        return decode_call(self, self.prompts(reqs), sigmas, keys, explore)

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
        a call (``JudgePlan``). With ``store``, finished keys are read back instead of
        recomputed, and each call's results are written in one transaction.

        Args:
            errors: ``raise``: the first failing request ends the run (finished calls are
                in the store). ``record``: a request that fails (a ``RECORDED_ERRORS`` error
                while computing its sigma, building its prompt or decoding it) comes back as
                a Judgment with ``error`` set and no verdict, is written to the store's
                failures, and the run goes on; a call that fails is retried request by
                request so only the failing ones are lost. Errors of the whole run (damaged
                weights giving NaN logits, an unreachable server, missing packages) still
                end it.
            retry_failed: with a store, judge again the requests whose failure it recorded
                (False: return those failures as they are).
        """
        record = errors == "record"
        if self.personas is not None:
            self.personas.prepare(reqs, store, progress)
        remote = self.executor is not None and self.config.uses_llm()
        spread = self.executor.calls_wanted() if remote else 1  # type: ignore[union-attr]
        plan = JudgePlan.build(self, reqs, store, retry_failed, record, spread)
        results, keys = dict(plan.done), plan.keys
        imported = len(store.imported(list(results))) if store is not None and results else 0
        bar, ahead = None, WorkAhead(lambda m: tqdm.write(m, file=sys.stderr))
        if progress:
            bar = tqdm(total=len(reqs), initial=len(reqs) - len(plan.todo), desc="judge",
                       unit="pair")  # fmt: skip
            ahead.start(len(plan.todo), len(plan.done))
        for batch, judged in self._stream(plan, record):
            for i, j in zip(batch, judged, strict=True):
                if isinstance(j, Exception):
                    j = self.failure(reqs[i], error_text(j), keys[i])
                j.key = keys[i]
                results[keys[i]] = j
            if store is not None:
                self.persist(store, [(reqs[i], results[keys[i]]) for i in batch])
            if bar is not None:
                bar.update(len(batch))
                ahead.done(len(batch))
            if on_batch is not None:
                on_batch(len(batch))
        if bar is not None:
            bar.close()
        out = [results[k] for k in keys]
        self.last_run = RunSummary(
            requests=len(reqs), reused=len(plan.done), imported=imported, judged=len(plan.todo),
            failed=sum(j.error is not None for j in out), retried_faults=plan.retried,
            workers=self.executor.workers() if self.executor is not None and plan.todo else {},
        )  # fmt: skip
        return out

    def _stream(
        self, plan: JudgePlan, record: bool
    ) -> Iterator[tuple[list[int], list[Judgment | Exception]]]:
        """The plan's results, (indices, results) per engine call: first the requests whose
        sigma failed, then the calls, run by the executor (a Ray cluster) when there is one
        and the mode uses the LLM, else in this process."""
        if plan.failed:
            yield list(plan.failed), list(plan.failed.values())
        if not plan.calls:
            return
        if self.executor is None or not self.config.uses_llm():
            for call in plan.calls:
                yield call, self.judge_prepared([plan.reqs[i] for i in call],
                                                [plan.keys[i] for i in call],
                                                plan.call_sigmas(call), record)  # fmt: skip
            return
        if self.personas is not None:
            raise ValueError(
                f"mode {self.config.mode!r} writes a persona per user first; judge it "
                "in one process (without --ray)"
            )
        yield from self.executor.run(self, plan, record)

    def judge_prepared(
        self,
        reqs: Sequence[JudgeRequest],
        keys: Sequence[str],
        sigmas: Sequence[float | None],
        record: bool = True,
    ) -> list[Judgment | Exception]:
        """Judge one engine call of a plan (keys and sigma computed by the judge that owns
        the CF model and the store; on a Ray worker, by the driver's): ``reward._call``'s
        ``judge_call``, the same sampling seeds (from ``keys``) wherever it runs. With
        ``record`` a failing request comes back as its exception; a fault of the whole run
        (``RunFault``) is raised."""
        return judge_call(self, reqs, keys, sigmas, record)

    def persist(self, store: ResultsStore, done: list[tuple[JudgeRequest, Judgment]]) -> None:
        """One transaction: the verdicts as results, the failures (no verdict) as failures."""
        store.put_many(
            [(j.key, stored_request(r, self.config), j.to_dict()) for r, j in done
             if j.error is None],
            [(j.key, stored_request(r, self.config), j.error) for r, j in done
             if j.error is not None],
        )  # fmt: skip

    def failure(self, req: JudgeRequest, error: str, key: str) -> Judgment:
        """A failed judgment: no verdict (p_yes NaN, so no average silently includes it)."""
        return Judgment(
            req.user_id, req.candidate_id, self.config.mode, False, [], float("nan"), None,
            None, 0.0, 0.0, "", key=key, error=error,
        )  # fmt: skip


class JudgeExecutor(Protocol):
    """Where ``Judge.judge_many`` runs its plan's engine calls.

    ``run`` yields, for each finished call of ``plan.calls``, the indices into ``plan.reqs``
    it judged and their results in the same order (a ``Judgment``, or with ``record`` the
    exception of a request that failed); the judge writes each to its store as it arrives.
    A fault of the whole run is raised. Every index of every call is yielded once.
    """

    def run(
        self, judge: Judge, plan: JudgePlan, record: bool
    ) -> Iterator[tuple[list[int], list[Judgment | Exception]]]: ...

    def calls_wanted(self) -> int:
        """The engine calls a plan should have at least (so every worker gets work): where
        packing gives fewer, the plan packs smaller calls."""
        ...

    def placed(self, llm_config: LLMConfig) -> LLMConfig:
        """The LLM config its workers load for ``llm_config`` (dtype and device resolved):
        the judge keys its results with it."""
        ...

    def workers(self) -> dict[str, int]:
        """Pairs each of its workers judged in the last ``run`` (by worker name)."""
        ...
