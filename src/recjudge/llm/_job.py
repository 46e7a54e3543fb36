"""The one argument recjudge's local engines decode by: ``EngineJob``.

It is the local half of ``recjudge.decoding.DecodeJob``: what the batch-invariant engine
(``recjudge.llm._engine``) and the fast shared-prefix engine (``recjudge.llm._fast``) need
beyond the token ids, written once instead of as the same twelve parameters in every engine
function. A sub-batch is ``job.subset(rows)``: its hooks, seeds, ``allowed`` and ``draft``
speak the sub-batch's row indices and call the caller's with the caller's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from recjudge.llm._config import SamplingConfig

if TYPE_CHECKING:
    import torch

    from recjudge.llm._engine import EngineStats

#: rows per decode batch unless a job says otherwise (the batch-invariant engine's fixed count)
DECODE_ROWS = 8

#: ``step(scores, rows)`` or ``step(scores, rows, columns)``: modify the rows' fp32
#: next-token scores in place (grammar mask, then bias)
Step = Callable[..., None]


@dataclass(frozen=True)
class EngineJob:
    """What an engine decodes by, for rows ``0..n-1`` of the token ids it is given.

    Attributes:
        step: ``step(scores, rows)`` modifies ``scores[i]`` (row ``rows[i]``) in place, e.g.
            grammar mask then branch bias; where the fast engine computed only some columns
            of the LM head (``allowed``) it is called as ``step(scores, rows, columns)``.
        accept: ``accept(row, token)`` after each chosen token.
        finished: ``finished(row)``: whether a row is done (checked after each token).
        sampling: decoding settings (greedy by default); ``max_new_tokens`` bounds each row.
        seeds: one seed per row for sampling (default ``sampling.seed + row``).
        stats: what the engine computed is added here (``EngineStats``), if given.
        rows: rows per decode batch: on the batch-invariant engine the fixed row count that
            makes a row's result independent of the others, on the fast engine a memory
            bound.
        deterministic: decode on the batch-invariant engine (bit-exact whatever the batch).
        allowed: ``allowed(rows)``: the token ids any of these rows may take next (sorted
            int64, or None for any); the fast shared-prefix engine then computes the LM head
            for those columns only.
        draft: ``draft(row)``: the token ids the row will probably take next (the grammar's
            forced text), verified in the row's next forward by the fast engine.
    """

    step: Step
    accept: Callable[[int, int], None]
    finished: Callable[[int], bool]
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    seeds: tuple[int, ...] | None = None
    stats: EngineStats | None = None
    rows: int = DECODE_ROWS
    deterministic: bool = False
    allowed: Callable[[list[int]], torch.Tensor | None] | None = None
    draft: Callable[[int], list[int]] | None = None

    def __post_init__(self) -> None:
        if self.rows < 1:
            raise ValueError(f"rows must be at least 1, got {self.rows}")
        if self.seeds is not None and not isinstance(self.seeds, tuple):
            object.__setattr__(self, "seeds", tuple(int(s) for s in self.seeds))

    def seed(self, row: int) -> int:
        """Row ``row``'s sampling seed."""
        return self.seeds[row] if self.seeds is not None else self.sampling.seed + row

    def subset(self, rows: Sequence[int]) -> EngineJob:
        """The job for a sub-batch whose row ``i`` is this job's ``rows[i]``."""
        rows = list(rows)
        step, accept, finished = self.step, self.accept, self.finished

        def sub_step(scores: Any, active: list[int], *columns: Any) -> None:
            step(scores, [rows[i] for i in active], *columns)

        allowed, draft = self.allowed, self.draft
        return replace(
            self,
            step=sub_step,
            accept=lambda i, t: accept(rows[i], t),
            finished=lambda i: finished(rows[i]),
            seeds=tuple(self.seed(r) for r in rows),
            allowed=None if allowed is None else lambda act: allowed([rows[i] for i in act]),
            draft=None if draft is None else lambda i: draft(rows[i]),
        )


def chunks(groups: Iterable[Sequence[int]], size: int) -> list[list[int]]:
    """Each group of row indices cut, in order, into runs of at most ``size`` rows (the
    decode batches of one call)."""
    return [list(g[b : b + size]) for g in groups for b in range(0, len(g), size)]


def by_rows(n: int, parts: Sequence[Sequence[int]], decode: Callable[..., list]) -> list:
    """Run ``decode(rows)`` for each part of ``range(n)`` and put each part's results back
    at its rows' places (results of rows no part holds are ``[]``)."""
    out: list = [[] for _ in range(n)]
    for rows in parts:
        for r, got in zip(rows, decode(list(rows)), strict=True):
            out[r] = got
    return out


__all__ = ["DECODE_ROWS", "EngineJob", "Step", "by_rows", "chunks"]
