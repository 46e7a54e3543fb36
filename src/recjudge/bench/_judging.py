"""What every BRIEF benchmark uses to judge: the decoding settings (``JudgeSampling``), the
CF model that gives sigma (``calibrated_cf``), the judges of a set of modes (``judges_for``)
and judging many requests user by user through the store, the bias settings swept from one
pass (``judge_per_user``, ``llm_made``). ``brief-ratings``/``brief-beta``, ``brief-offline``,
``brief-offline-estimators`` and ``brief-augment`` import them from here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from recjudge.reward import SIMULATOR_MODES

if TYPE_CHECKING:
    from recjudge.llm import LLMBackend

SIMULATORS = SIMULATOR_MODES  # the paper's user-simulator baselines
CF_MODES = ("brief", "non-adaptive", "cf-only", "item-item")


class JudgeSampling(BaseModel):
    """How every BRIEF bench decodes the judge.

    Attributes:
        sampling: ``greedy`` (our default: one greedy read-out per pair; its reward is the
            verdict and p_yes the YES-branch probability) or ``paper`` (BRIEF's decoding:
            T 0.7, top-p 0.8, top-k 20, ``samples`` samples per pair; a pair's reward is
            the share of YES samples, so "% positive" is over samples as in the paper).
        samples: samples per pair with ``paper``.
        dtype: the judge's compute dtype (``LLMConfig.dtype``). ``auto`` picks bf16 on CPUs
            with native bf16 and fp32 elsewhere; results are stored under their dtype, so a
            run resumed on another kind of CPU (``recjudge store import``) names the dtype it
            was started with.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    sampling: Literal["greedy", "paper"] = "greedy"
    samples: int = Field(5, ge=1)
    dtype: Literal["auto", "bfloat16", "float32"] = "auto"

    def judge_llm(self, model: str) -> Any:
        """The judge LLM ``model`` loaded in this config's dtype."""
        from recjudge.llm import LLMConfig, load_llm

        return load_llm(LLMConfig(model=model, dtype=self.dtype))

    @property
    def sampled(self) -> bool:
        """Whether judgments are sampled (their p_yes is a share of YES samples) rather than
        greedy read-outs (p_yes is the model's probability)."""
        return self.sampling == "paper"

    def sampling_note(self) -> str:
        """The decoding in words, for a report header."""
        if self.sampled:
            return (
                f"the paper's sampling (T 0.7, top-p 0.8, top-k 20, {self.samples} samples per "
                "pair; % positive over samples)"
            )
        return "greedy read-out (a deviation: the paper samples; `--sampling paper`)"


def calibrated_cf(
    name: str, interactions: Any, items: Sequence[str], seed: int, side: Any = None
) -> Any:
    """CF model ``name`` trained on the leave-one-out train part of ``interactions``, its
    sigma scale calibrated on the held-out validation items (and random unseen items).
    ``side``: the dataset's ``SideInfo``, for models that use item/user attributes."""
    from recjudge.cf_models import MODELS, TrainOptions
    from recjudge.cf_models._eval import calibration_pairs
    from recjudge.data import leave_one_out

    split = leave_one_out(interactions)
    cls = MODELS.get(name)
    model = cls(cls.Config())
    model.train(split.train, TrainOptions(seed=seed, progress=False), items=list(items), side=side)
    hs, cs, us = calibration_pairs(split.train, split.valid, model.items, seed)
    model.calibrate(hs, cs, us)
    return model


def judge_per_user(
    reqs: Sequence[Any],
    judges: Mapping[str, Any],
    store: Any,
    progress: bool,
    errors: Literal["raise", "record"] = "raise",
) -> tuple[dict[str, list[Any]], dict[str, dict[str, int]], int, int]:
    """Every judge on every request, one user at a time so judges share the user's prefix.
    The settings that differ only in their bias (``reward.can_sweep``) are decided from one
    decoding pass per request (``reward.sweep_into_store``), the others judged one by one.
    ``errors="record"``: a request that fails is recorded (``Judge.judge_many``) and the run
    goes on; a user whose shared pass fails is judged setting by setting instead.

    Returns:
        The judgments per judge name; per name ``{"new", "total"}``: judgments made in this
        call (not in the store before) and all requests; and the LLM decoding passes made
        (one per swept request, one per other LLM judgment); and the swept requests decided
        from stored decision records without the model.
    """
    from recjudge.reward import RECORDED_ERRORS, can_sweep, sweep_into_store

    users: dict[str, list[int]] = {}
    for i, r in enumerate(reqs):
        users.setdefault(r.user_id, []).append(i)
    out: dict[str, list[Any]] = {name: [None] * len(reqs) for name in judges}
    for judge in judges.values():  # the simulators' personas, all users batched together
        if getattr(judge, "simulator", None) is not None:
            judge.prepare_personas(reqs, store, progress)
    swept = {name: judges[name] for name in can_sweep(judges)}
    counts = {name: {"new": 0, "total": 0} for name in judges}
    passes = replayed = 0
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(users), desc=f"judge ({len(judges)} settings)", unit="user")
    for idx in users.values():
        sub = [reqs[i] for i in idx]
        if swept:
            try:
                fill = sweep_into_store(swept, sub, store)
            except RECORDED_ERRORS:
                if errors == "raise":
                    raise
            else:
                passes += fill.decoded
                replayed += fill.replayed
                for name, n in fill.written.items():
                    counts[name]["new"] += n
        for name, judge in judges.items():
            for i, j in zip(idx, judge.judge_many(sub, store, errors=errors), strict=True):
                out[name][i] = j
            # 0 for the swept ones (read back), unless their shared pass failed
            counts[name]["new"] += judge.last_run.judged
            counts[name]["total"] += judge.last_run.requests
            if judge.config.uses_llm():
                passes += judge.last_run.judged
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return out, counts, passes, replayed


def llm_made(judges: Mapping[str, Any], counts: Mapping[str, Mapping[str, int]]) -> dict:
    """From ``judge_per_user``'s counts, the LLM judges' judgments made in that call
    (``judged_now``) and their requests (``requests``); a judge without an LLM (cf-only)
    makes no model judgments."""
    llm = [name for name, j in judges.items() if j.config.uses_llm()]
    return {
        "judged_now": sum(counts[n]["new"] for n in llm),
        "requests": sum(counts[n]["total"] for n in llm),
    }


def judges_for(
    config: Any,
    llm: LLMBackend,
    cf: Any,
    settings: Sequence[str | tuple[str, str, Any, float]],
    population: Any = None,
) -> dict[str, Any]:
    """Reward read-out judges on ``config.model``: a mode name (beta ``config.beta``, sigma
    from ``cf``), or ``(name, mode, CF model, beta)``. ``config`` needs ``model``, ``beta``,
    ``history_items`` and ``decode_rows`` (and, from ``JudgeSampling``, ``sampled`` and
    ``samples``). ``population``: what the agent4rec and recagent simulators read about the
    training data (``reward.Population.of``)."""
    from recjudge.llm import SamplingConfig
    from recjudge.reward import Judge, JudgeConfig

    paper = getattr(config, "sampled", False)
    decoding = (
        {"sampling": SamplingConfig.paper(config.seed), "samples": config.samples} if paper else {}
    )
    judges = {}
    for s in settings:
        name, mode, model, beta = (s, s, cf, config.beta) if isinstance(s, str) else s
        jc = JudgeConfig(
            model=config.model,
            mode=mode,
            beta=beta,
            need_evidence=False,
            max_history=config.history_items,
            decode_rows=config.decode_rows,
            **decoding,
        )
        judges[name] = Judge(
            jc,
            llm=llm,
            cf=model if mode in CF_MODES else None,
            population=population if mode in SIMULATORS else None,
        )
    return judges
