"""A judge's plan of work for a list of requests (``JudgePlan``): the one planner.

Keys, the results a store already holds, what is left to judge, sigma (once per user and
history) and the engine calls, grouped by prompt prefix without the model. ``judge_many``
runs the plan's calls in its own process, and every executor (Ray actors, Ray Data LLM) runs
the same calls: a distributed run decodes the batches one process would."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from recjudge._util import gc_paused
from recjudge.reward._call import PromptGroups, Role
from recjudge.reward._judge_config import JudgeConfig
from recjudge.reward._judgment import JudgeRequest, Judgment, is_run_fault
from recjudge.reward._requests import stored_request
from recjudge.reward._store import ResultsStore, StoreError
from recjudge.reward._stored import adopt_rows

if TYPE_CHECKING:
    from recjudge.reward._judge import Judge
    from recjudge.reward._keys import JudgeKeys

_REQUIRED = ("user_id", "candidate_id", "mode", "is_relevant", "evidence", "p_yes", "raw_text")


def stored_judgment(store: ResultsStore, key: str, row: dict[str, Any]) -> Judgment:
    """A stored result as a Judgment; a row that is not one is named, not guessed at."""
    missing = [f for f in _REQUIRED if f not in row]
    if missing:
        raise StoreError(
            f"results store {store.path}: the result stored under key {key!r} lacks "
            f"{missing}; it was not written by this version or was edited. Remove the store "
            "(or that row) and run again"
        )
    return Judgment.from_dict(row)


@dataclass
class JudgePlan:
    """What a judge does for ``reqs``.

    Attributes:
        reqs: the requests, in the caller's order.
        keys: each request's result key.
        done: the results the store already holds, by key (a request's ids filled in where
            an imported row has none), and without ``retry_failed`` its recorded failures.
        retried: recorded failures judged again although ``retry_failed`` is off: faults of
            the whole run (``is_run_fault``), which the user has presumably fixed since.
        todo: the index of each key's first request, for keys not done (a key asked twice
            in one run is judged once).
        sigmas: sigma of each ``todo`` request whose sigma could be computed.
        failed: the ``todo`` requests whose sigma failed (recorded errors, with ``record``).
        calls: the engine calls, indices into ``reqs``: up to ``config.batch()`` requests,
            one prompt group (``prompt_group``) kept together, groups packed into a call
            while they fit, in order of first appearance.
    """

    reqs: Sequence[JudgeRequest]
    keys: list[str]
    done: dict[str, Judgment] = field(default_factory=dict)
    retried: int = 0
    todo: list[int] = field(default_factory=list)
    sigmas: dict[int, float | None] = field(default_factory=dict)
    failed: dict[int, Exception] = field(default_factory=dict)
    calls: list[list[int]] = field(default_factory=list)

    @classmethod
    def build(
        cls,
        judge: Judge,
        reqs: Sequence[JudgeRequest],
        store: ResultsStore | None = None,
        retry_failed: bool = True,
        record: bool = False,
        spread: int = 1,
    ) -> JudgePlan:
        """Plan ``judge``'s work for ``reqs``, reusing what ``store`` holds.

        Args:
            record: a request whose sigma fails goes to ``failed`` (else it is raised).
            spread: the calls wanted at least, for as many workers (``plan_calls``).
        """
        with gc_paused():  # a burst of keys and calls (see gc_paused)
            return cls._build(judge, reqs, store, retry_failed, record, spread)

    @classmethod
    def _build(
        cls,
        judge: Judge,
        reqs: Sequence[JudgeRequest],
        store: ResultsStore | None,
        retry_failed: bool,
        record: bool,
        spread: int,
    ) -> JudgePlan:
        plan = cls(reqs, [judge.key(r) for r in reqs])
        plan._reuse(judge, store, retry_failed)
        plan.todo = _first_of_each_missing(plan.keys, plan.done)
        if plan.todo:
            got = judge.sigmas_for([reqs[i] for i in plan.todo])
            for i, s in zip(plan.todo, got, strict=True):
                if isinstance(s, Exception):
                    if not record:
                        raise s
                    plan.failed[i] = s
                else:
                    plan.sigmas[i] = s
        plan.calls = plan_calls(judge.config, reqs, [i for i in plan.todo if i in plan.sigmas],
                                spread, judge.role)  # fmt: skip
        return plan

    def _reuse(self, judge: Judge, store: ResultsStore | None, retry_failed: bool) -> None:
        """``done`` and ``retried`` from ``store`` (see the attributes)."""
        if store is None:
            return
        reqs, keys = self.reqs, self.keys
        rows = store.get_many(keys)
        adopt_former_keys(judge.keys, store, reqs, keys, rows,
                          lambda r: stored_request(r, judge.config),
                          lambda k, row: {**row, "key": k})  # fmt: skip
        self.done = {k: stored_judgment(store, k, v) for k, v in rows.items()}
        for i, k in enumerate(keys):  # a row imported from a checkpoint has no ids
            if k in self.done and self.done[k].user_id is None:
                self.done[k] = replace(self.done[k], user_id=reqs[i].user_id,
                                       candidate_id=reqs[i].candidate_id)  # fmt: skip
        if retry_failed:
            return
        old = store.failures([k for k in keys if k not in self.done])
        faults = {k for k, e in old.items() if is_run_fault(e)}
        self.retried = len(faults)
        for i, k in enumerate(keys):
            if k in old and k not in self.done and k not in faults:
                self.done[k] = judge.failure(reqs[i], old[k], k)

    def call_sigmas(self, call: Sequence[int]) -> list[float | None]:
        """Sigma of a call's requests, in order."""
        return [self.sigmas[i] for i in call]


def plan_calls(
    config: JudgeConfig,
    reqs: Sequence[JudgeRequest],
    todo: Sequence[int],
    spread: int = 1,
    role: Role | None = None,
) -> list[list[int]]:
    """The engine calls for requests ``todo``, planned without the model: up to
    ``config.batch()`` requests each, one prompt group (``prompt_group``) kept together,
    groups packed into a call while they fit, in order of first appearance.

    ``spread``: the calls wanted at least, for as many workers. Where packing gives fewer,
    groups are packed only up to ``ceil(len(todo) / spread)`` requests a call (a group is
    still never split below ``batch()``), so a small run of many users reaches every worker;
    it never changes a result (``batch_size`` does not)."""
    size = config.batch()
    fill = max(1, -(-len(todo) // max(spread, 1)))
    if not config.uses_llm():  # no prompt: nothing to group by
        size = min(size, fill) if -(-len(todo) // size) < spread else size
        return [list(todo[b : b + size]) for b in range(0, len(todo), size)]
    groups: dict[Any, list[int]] = {}
    group = PromptGroups(config, role)
    for i in todo:
        groups.setdefault(group(reqs[i]), []).append(i)
    calls = _pack(groups.values(), size)
    if len(calls) < spread:
        calls = _pack(groups.values(), size, fill)
    return calls


def adopt_former_keys(
    keys: JudgeKeys,
    store: Any,
    reqs: Sequence[JudgeRequest],
    now: Sequence[str],
    rows: dict[str, dict[str, Any]],
    request_of: Callable[[JudgeRequest], dict[str, Any]],
    row_for: Callable[[str, dict[str, Any]], dict[str, Any]] | None = None,
    bias: bool = True,
) -> None:
    """The key migration for a judge's rows (``adopt_rows``): a result (``bias``) or
    decision record (not ``bias``) that ``store`` holds only under one of a request's former
    keys (``JudgeKeys.former``: the LLM settings' earlier forms) is copied to its key in
    ``now``, in ``rows`` and in the store, with ``request_of(request)`` beside it. Nothing to
    do for most LLMs."""
    if not keys.has_former():
        return
    former = {k: (keys.former(r, bias), request_of(r))
              for r, k in zip(reqs, now, strict=True) if k not in rows}  # fmt: skip
    rows.update(adopt_rows(store, former, row_for))


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
