"""What every BRIEF benchmark uses to judge: the decoding settings (``JudgeSampling``) and
the judges of a set of modes (``judges_for``). ``brief-ratings``/``brief-beta``,
``brief-offline``, ``brief-offline-estimators`` and ``brief-augment`` import them from here;
the CF model that gives sigma is ``cf_models.calibrated_cf`` and judging many requests user by
user through the store is ``reward.judge_per_user`` (evaluators use them too).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from recjudge.llm import LLMConfig, SamplingConfig, load_llm
from recjudge.reward import CF_MODES as _CF_MODES
from recjudge.reward import SIMULATOR_MODES, Judge, JudgeConfig

if TYPE_CHECKING:
    from recjudge.llm import LLMBackend

SIMULATORS = SIMULATOR_MODES  # the paper's user-simulator baselines
CF_MODES = _CF_MODES  # the modes whose verdict reads sigma (from the mode records)


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
