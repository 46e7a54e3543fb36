"""One Ray run's planned work (``RayRun``): what the executor hands to either of its paths,
our engine on Ray actors (``_executor``) and vLLM through Ray Data LLM (``_ray_data_llm``),
which import it from here and not from each other."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from recjudge.llm import LLMConfig
    from recjudge.reward import Judge, JudgeRequest, Judgment


@dataclass(frozen=True)
class RayRun:
    """One Ray run's planned work, what both of its paths (our engine on Ray actors, vLLM
    through Ray Data LLM) are given: the judge and its requests, their keys, the engine calls
    planned from them (each request with its index, key and sigma), the LLM config the
    workers load, and whether a request's error is recorded rather than raised."""

    judge: Judge
    reqs: Sequence[JudgeRequest]
    keys: Sequence[str]
    calls: list[list[dict[str, Any]]]
    llm_config: LLMConfig
    record: bool

    def failure(self, i: int, error: str) -> Judgment:
        """Request ``i``'s recorded failure, under its key."""
        return self.judge.failure(self.reqs[i], error, self.keys[i])
