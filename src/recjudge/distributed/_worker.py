"""A Ray worker's side of a judgment: the requests as the records a worker reads
(``call_records``: each history sent once per call) and ``JudgeWorker``, the Ray Data actor
that holds one judge and runs the plan's engine calls it is sent (``Judge.judge_prepared``)."""

from __future__ import annotations

import json
import logging
import os
import socket
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from recjudge._util import RunFault
from recjudge.llm import LLMConfig
from recjudge.reward import HistoryItem, Judge, JudgeConfig, JudgeRequest, Judgment, error_text

if TYPE_CHECKING:
    from recjudge.reward import JudgeRequest

log = logging.getLogger(__name__)


def request_record(
    req: JudgeRequest, history_of: int | None = None, shown: int | None = None
) -> dict[str, Any]:
    """What a worker needs of a request to render and decode it (its sigma travels beside
    it; ``meta`` stays on the driver). ``history_of``: the position, in the same call, of a
    request with this very history, sent in its place (one user's candidates share one
    history: sent once per call, not once per pair). ``shown``: only the history's most
    recent ``shown`` items are sent (``reward.history_sent``: what the prompt can show; the
    key, computed on the driver, covers the whole history); None: all of it."""
    history = req.history if shown is None else req.history[-shown:]
    older = req.older + len(req.history) - len(history)
    return {
        "user_id": req.user_id,
        **({"history_of": history_of} if history_of is not None else
           {"history": [[h.item_id, h.title, h.text, h.rating] for h in history],
            **({"older": older} if older else {})}),
        "candidate_id": req.candidate_id,
        "candidate_text": req.candidate_text,
        "candidate_title": req.candidate_title,
        "domain": req.domain,
    }  # fmt: skip


def call_records(reqs: Sequence[JudgeRequest], shown: int | None = None) -> list[dict[str, Any]]:
    """``request_record`` of one call's requests, each history sent once (``shown``: as
    there)."""
    if shown is not None and shown < 1:
        raise ValueError(f"shown must be >= 1 or None, got {shown}")
    out: list[dict[str, Any]] = []
    holders: dict[tuple[str, ...], int] = {}
    by_list: dict[int, int] = {}  # a shared list is recognised at once, not item by item
    for n, req in enumerate(reqs):
        first = by_list.setdefault(id(req.history), n)
        if first != n and reqs[first].history is req.history:
            out.append(request_record(req, first, shown))
            continue
        j = holders.setdefault(tuple(h.item_id for h in req.history), n)
        # same ids, same texts and ratings
        same = j if j != n and reqs[j].history == req.history else None
        out.append(request_record(req, same, shown))
    return out


def call_units(
    reqs: Sequence[JudgeRequest],
    calls: Sequence[Sequence[int]],
    keys: Sequence[str],
    sigmas: Any,
    shown: int | None = None,
) -> list[list[dict[str, Any]]]:
    """A plan's engine ``calls`` (indices into ``reqs``) as a worker reads them: each request
    with its index, key and sigma (``keys[i]``, ``sigmas[i]``) and its record
    (``call_records``: each history once per call, ``shown`` items of it)."""
    return [[{"i": i, "key": keys[i], "sigma": sigmas[i], "req": rec}
             for i, rec in zip(call, call_records([reqs[i] for i in call], shown), strict=True)]
            for call in calls]  # fmt: skip


def request_from_record(d: dict[str, Any], earlier: Sequence[JudgeRequest] = ()) -> JudgeRequest:
    """The request of ``request_record``'s ``d``; ``earlier``: the call's requests before it
    (where a ``history_of`` points)."""
    if "history_of" in d:
        same = earlier[int(d["history_of"])]
        history, older = same.history, same.older
    else:
        history = [HistoryItem(str(a), str(b), str(c), r) for a, b, c, r in d["history"]]
        older = int(d.get("older", 0))
    return JudgeRequest(
        user_id=d["user_id"],
        history=history,
        candidate_id=d["candidate_id"],
        candidate_text=d["candidate_text"],
        candidate_title=d["candidate_title"],
        domain=d["domain"],
        older=older,
    )


def worker_name() -> str:
    """This process as the driver names a worker: ``host:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"


class JudgeWorker:
    """A Ray Data actor holding one judge (one backend); each row is one engine call.

    The model loads on the first call, not in ``__init__``: a load that fails (not
    installed on this node) then comes back as a fault row the driver ends the run with,
    instead of an actor Ray Data would restart forever.
    """

    def __init__(self, config: str, llm_config: str, record: bool) -> None:
        self._config, self._llm_config, self._record = config, llm_config, record
        self._judge: Any = None

    def _load(self) -> Any:
        if self._judge is None:
            llm_config = LLMConfig.model_validate_json(self._llm_config)
            judge = Judge(JudgeConfig.model_validate_json(self._config), llm_config=llm_config)
            judge.warm_up()
            self._judge = judge
        return self._judge

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        out = [self.unit(str(text)) for text in batch["unit"]]
        return {"result": np.array(out, dtype=object)}

    def unit(self, text: str) -> str:
        """One block's engine calls (JSON) -> their results (JSON)."""
        results: list[dict[str, Any]] = []
        try:
            judge = self._load()
            for call in json.loads(text):
                reqs: list[Any] = []
                for x in call:
                    reqs.append(request_from_record(x["req"], reqs))
                got = judge.judge_prepared(
                    reqs, [x["key"] for x in call], [x["sigma"] for x in call], self._record
                )
                for x, j in zip(call, got, strict=True):
                    if isinstance(j, Judgment):
                        results.append({"i": x["i"], "judgment": j.to_dict()})
                    else:
                        results.append({"i": x["i"], "error": error_text(j)})
        except RunFault as e:
            return json.dumps({"fault": error_text(e)})
        except Exception as e:  # noqa: BLE001 - raise mode: the driver raises it
            return json.dumps({"fault": error_text(e), "run_fault": False})
        return json.dumps({"results": results, "worker": worker_name()})
