"""What a judge is asked and what it answers: ``JudgeRequest``, ``Judgment``, a run's
``RunSummary``, one decoded call (``DecodedCall``), the answer's parsing, and which errors
are recorded per pair and which end the run."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from recjudge._util import RunFault
from recjudge.reward._prompt import HistoryItem

if TYPE_CHECKING:
    pass


@dataclass
class JudgeRequest:
    """One (user, candidate) question. ``sigma`` overrides the judge's CF model.

    ``older``: how many items the user's history holds before ``history`` that were left
    out of this request: a Ray worker's request carries only what the prompt can show
    (``history_sent``), and its prompt still counts the rest as not shown. 0 everywhere
    else; a request with ``older`` has no key of its own (the driver's covers the whole
    history)."""

    user_id: str
    history: list[HistoryItem]
    candidate_id: str
    candidate_text: str
    candidate_title: str = ""
    sigma: float | None = None
    domain: str = "generic"
    meta: dict[str, Any] = field(default_factory=dict)
    older: int = 0

    def __post_init__(self) -> None:
        if not self.history:
            raise ValueError(
                f"user {self.user_id!r} has an empty history; the judge needs at "
                "least one past item"
            )
        if self.older < 0:
            raise ValueError(f"older must be >= 0, got {self.older}")


# Errors that belong to one request (its text, ids, grammar or sigma), recorded per request
# by ``judge_many(errors="record")``. Anything else (a broken model, an unreachable server,
# missing packages, interruption) ends the run; so does a ``RunFault`` (``_util``), whatever
# built-in class it also is (ModelNotInstalledError is a RuntimeError).
RECORDED_ERRORS: tuple[type[Exception], ...] = (
    ValueError,
    KeyError,
    IndexError,
    RuntimeError,
    UnicodeError,
    ArithmeticError,
)


#: whole-run faults by the class name a recorded failure starts with (``Type: message``),
#: besides every ``RunFault`` subclass: what stores of earlier versions recorded per pair
RUN_FAULT_NAMES = ("ModelNotInstalledError", "ModelIntegrityError", "ModelLoadError",
                   "DeviceError", "DtypeEnvError", "BackendError", "NonFiniteLogitsError",
                   "ServerError", "ConnectionError", "ConnectionRefusedError", "TimeoutError",
                   "StoreError", "CacheDirError", "OutOfMemoryError")  # fmt: skip


def error_text(error: BaseException) -> str:
    """A per-request failure as recorded (``Type: message``: what ``is_run_fault`` reads)."""
    return f"{type(error).__name__}: {error}"


def is_run_fault(error: str) -> bool:
    """Whether a recorded failure's text (``Type: message``) names a fault of the whole run
    (``RUN_FAULT_NAMES`` or any loaded ``RunFault`` subclass), not of its one request."""
    name = str(error).partition(":")[0].strip()
    if name in RUN_FAULT_NAMES:
        return True
    todo, seen = [RunFault], set()
    while todo:
        cls = todo.pop()
        if cls.__name__ == name:
            return True
        for sub in cls.__subclasses__():
            if sub not in seen:
                seen.add(sub)
                todo.append(sub)
    return False


@dataclass(frozen=True)
class RunSummary:
    """Counts of the last ``judge_many`` call: requests, reused from the store (including
    recorded failures not retried), judged now, and failed (no verdict)."""

    requests: int
    reused: int
    judged: int
    failed: int
    imported: int = 0  # of the reused, rows a checkpoint import brought (store import)
    retried_faults: int = 0  # recorded failures of a whole-run fault, judged again
    #: pairs judged now per executor worker (a Ray actor: ``node:pid``); empty in process
    workers: dict[str, int] = field(default_factory=dict)


@dataclass
class Judgment:
    """The judge's answer for one request.

    Attributes:
        is_relevant: the verdict.
        evidence: cited titles (a subset of the prompt's history titles, as shown).
        evidence_ids: the item ids of the cited titles, in the same order (titles shared
            by several items are shown with ``[id ITEM]``, so each names one item).
        p_yes: YES-branch probability at the decision step after the bias.
        p_yes_semantic: the same before the bias (the LLM alone).
        sigma, delta, entropy: the behavioural signal, the logit shift on YES, and E_n.
        raw_text: the constrained JSON the model produced.
    """

    user_id: str
    candidate_id: str
    mode: str
    is_relevant: bool
    evidence: list[str]
    p_yes: float
    p_yes_semantic: float | None
    sigma: float | None
    delta: float
    entropy: float
    raw_text: str
    decision_steps: int = 0
    history_shown: int = 0
    history_dropped: int = 0
    samples_yes: int | None = None
    key: str = ""
    error: str | None = None
    evidence_ids: list[str] = field(default_factory=list)

    @property
    def log_odds(self) -> float:
        """``log P(YES) / P(NO)`` at the decision step after the bias.

        ``logit(p_yes_semantic) + 2 * delta``: the bias adds ``+delta`` to the YES branch and
        ``-delta`` to NO. ``p_yes`` itself saturates: at ``beta = 25`` a delta of 20 gives
        ``P(NO) ~ 1e-17``, and ``p_yes`` is exactly 1.0 in float64 for every such candidate,
        so ranking by it ties them all; the log-odds keeps their order. Without an LLM
        decision (cf-only, or the grammar alone decided) it is ``logit(p_yes)``. Probabilities
        are clipped to ``[1e-12, 1 - 1e-12]`` so the value is always finite.
        """
        if self.p_yes_semantic is None:
            return _logit(self.p_yes)
        return _logit(self.p_yes_semantic) + 2.0 * self.delta

    def to_dict(self) -> dict[str, Any]:
        """All fields; for a failed judgment only who, the key and the error (no verdict)."""
        if self.error is not None:
            return {
                "user_id": self.user_id,
                "candidate_id": self.candidate_id,
                "mode": self.mode,
                "key": self.key,
                "error": self.error,
            }
        # fields are flat (strings, numbers, lists of strings): copy the lists, no deep
        # walk (``asdict`` was most of the driver's cost of merging a result)
        d = {f: getattr(self, f) for f in self.__dataclass_fields__ if f != "error"}
        d["evidence"], d["evidence_ids"] = list(self.evidence), list(self.evidence_ids)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Judgment:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


def _logit(p: float) -> float:
    q = min(max(float(p), 1e-12), 1.0 - 1e-12)
    return math.log(q) - math.log1p(-q)


@dataclass
class DecodedCall:
    """One decoded batch: per request its rendered prompt, schema and sigma; per decoded row
    (``rows[k]`` = its request) the decision record and answer text."""

    rendered: list[Any]
    schemas: list[Any]
    sigmas: list[float | None]
    rows: list[int]
    records: list[Any]
    texts: list[str]


def parse_answer(schema: Any, text: str) -> Any | None:
    """The parsed answer, or None for text that is not a whole answer (a read-out)."""
    try:
        return schema.parse(text)
    except ValueError:  # SchemaError / JSONDecodeError: a read-out stops before it closes
        return None


def parsed_evidence(schema: Any, text: str) -> list[str]:
    """The evidence titles of a complete answer; [] for a read-out that stopped early."""
    value = parse_answer(schema, text)
    return [] if value is None else list(value.get("evidence", []))
