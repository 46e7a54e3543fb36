"""The evaluators the CLI can run by name from a saved config (``recjudge run NAME``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from recjudge._registry import Registry
from recjudge.evaluators.arena._arena import ArenaConfig, run_arena
from recjudge.evaluators.arena._lists import ArenaListConfig, run_arena_lists
from recjudge.evaluators.gist._config import GistConfig
from recjudge.evaluators.gist._pipeline import run_gist
from recjudge.evaluators.usersum._usersum import UserSumConfig, run_usersum


@dataclass(frozen=True)
class EvaluatorSpec:
    """One runnable evaluator.

    Attributes:
        config: its frozen config class (what ``results.json`` stores under ``config``).
        run: ``run(config, data, out, progress=...) -> results``.
        summary: one line for ``recjudge evaluators list``.
        default_out: where its report goes by default.
        json_view: the part of its results ``--json`` prints (default: all but the per-user
            and per-answer records, which its report folder keeps).
    """

    config: type[BaseModel]
    run: Callable[..., dict[str, Any]]
    summary: str
    default_out: str
    json_view: Callable[[dict[str, Any]], Any] | None = None

    def view(self, results: dict[str, Any]) -> Any:
        """What ``--json`` prints of ``results``."""
        if self.json_view is not None:
            return self.json_view(results)
        return {k: v for k, v in results.items() if k not in ("users", "answers")}


def _gist_view(r: dict[str, Any]) -> Any:
    # the scores per model, without each user's row (interests.jsonl keeps them)
    return {m: {k: v for k, v in s.items() if k != "users"} for m, s in r["scores"].items()}


EVALUATORS: Registry[EvaluatorSpec] = Registry("evaluator")


def _register() -> None:
    EVALUATORS.register("arena", EvaluatorSpec(
        ArenaConfig, run_arena, "RecSys Arena: systems judged pairwise against a reference",
        "reports/arena"))  # fmt: skip
    EVALUATORS.register("arena-lists", EvaluatorSpec(
        ArenaListConfig, run_arena_lists,
        "List-level arena (our extension): every listed item judged by BRIEF, lists by score",
        "reports/arena-lists"))  # fmt: skip
    EVALUATORS.register("gist", EvaluatorSpec(
        GistConfig, run_gist, "GISTBench: interest extraction, verification, IG and IS",
        "reports/gist", _gist_view))  # fmt: skip
    EVALUATORS.register("usersum", EvaluatorSpec(
        UserSumConfig, run_usersum, "UserSumBench: summary quality by future prediction",
        "reports/usersum", lambda r: r["table"]))  # fmt: skip


_register()
