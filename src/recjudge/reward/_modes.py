"""Judge modes as data: one frozen record per mode, registered once; every tuple of modes
(those that use CF, those a sweep can replay, the simulators, ...) is derived from it.

Adding a mode is one ``ModeSpec`` here (and, for a new kind of judge, its code path); the
config's ``Literal``, ``MODES``, ``SIMULATOR_MODES``, ``SWEEPABLE``, ``CF_MODES`` and
``LLM_MODES`` follow.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from recjudge._registry import Registry

__all__ = ["CF_MODES", "LLM_MODES", "MODE_SPECS", "MODES", "SIMULATOR_MODES", "SWEEPABLE",
           "ModeSpec", "mode_spec"]  # fmt: skip


@dataclass(frozen=True)
class ModeSpec:
    """What a judge mode is.

    Attributes:
        name: the mode's name (``JudgeConfig.mode``, ``--mode``).
        uses_cf: the verdict reads sigma from a CF model.
        uses_llm: an LLM answers (False: the CF signal alone decides).
        plain_verdict: a bare ``{"is_relevant": ...}`` answer (no evidence list).
        bias: the decision-step bias: ``adaptive`` (Delta = beta (1 + E_n) sigma),
            ``fixed`` (Delta = beta sigma) or ``none`` (beta 0: the LLM alone).
        sweepable: settings differing only in bias are decided from one recorded greedy
            pass (``reward.judge_sweep``).
        simulator: a user-simulator baseline (a persona first, then a plain YES/NO).
        summary: one line for help texts.
    """

    name: str
    uses_cf: bool
    uses_llm: bool
    plain_verdict: bool
    bias: Literal["adaptive", "fixed", "none"]
    sweepable: bool
    simulator: bool
    summary: str


MODE_SPECS: Registry[ModeSpec] = Registry("judge mode")
for _spec in (
    ModeSpec("brief", True, True, False, "adaptive", True, False,
             "evidence-first answer + the entropy-adaptive CF bias (the paper's method)"),
    ModeSpec("non-adaptive", True, True, False, "fixed", True, False,
             "evidence-first + Delta = beta * sigma (ablation)"),
    ModeSpec("no-behavior", False, True, False, "none", True, False,
             "evidence-first, no CF bias (ablation)"),
    ModeSpec("zero-shot", False, True, True, "none", False, False,
             "a plain YES/NO from the LLM"),
    ModeSpec("cf-only", True, False, False, "adaptive", False, False,
             "sigma > threshold, no LLM"),
    ModeSpec("item-item", True, True, False, "adaptive", True, False,
             "brief with the item-item sigma"),
    ModeSpec("pub", False, True, True, "none", False, True, "PUB user simulator"),
    ModeSpec("agent4rec", False, True, True, "none", False, True, "Agent4Rec user simulator"),
    ModeSpec("recagent", False, True, True, "none", False, True, "RecAgent user simulator"),
):  # fmt: skip
    MODE_SPECS.register(_spec.name, _spec)

MODES: tuple[str, ...] = tuple(MODE_SPECS)
SIMULATOR_MODES: tuple[str, ...] = tuple(m for m in MODES if MODE_SPECS.get(m).simulator)
SWEEPABLE: tuple[str, ...] = tuple(m for m in MODES if MODE_SPECS.get(m).sweepable)
CF_MODES: tuple[str, ...] = tuple(m for m in MODES if MODE_SPECS.get(m).uses_cf)
LLM_MODES: tuple[str, ...] = tuple(m for m in MODES if MODE_SPECS.get(m).uses_llm)


def mode_spec(name: str) -> ModeSpec:
    """The record of mode ``name`` (``UnknownNameError`` with "did you mean")."""
    return MODE_SPECS.get(name)
