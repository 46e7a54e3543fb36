"""The CF signal sigma of judge requests (``Judge.sigma_for`` / ``Judge.sigmas_for``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from recjudge._util import RunFault
from recjudge.reward._judge_config import JudgeConfig
from recjudge.reward._judgment import RECORDED_ERRORS, JudgeRequest


def sigma_for(config: JudgeConfig, cf: Any, req: JudgeRequest) -> float | None:
    """The request's own sigma (clipped to [-1, 1]) when it carries one, else the CF model's
    ``sigma(history, candidate, user)``; None for a mode that reads no CF signal.

    Raises:
        ValueError: a non-finite sigma, or a mode that needs a CF model and has none.
    """
    if req.sigma is not None:
        if not np.isfinite(req.sigma):
            raise ValueError(f"request {req.user_id}/{req.candidate_id}: sigma is not finite")
        return float(np.clip(req.sigma, -1.0, 1.0))
    if not config.uses_cf():
        return None
    if cf is None:
        raise ValueError(
            f"mode {config.mode!r} needs a CF model (or a sigma per request); pass cf=... "
            "or --cf DIR"
        )
    return cf.sigma([h.item_id for h in req.history], req.candidate_id, req.user_id)


def sigmas_for(
    config: JudgeConfig,
    cf: Any,
    reqs: Sequence[JudgeRequest],
    single: Callable[[JudgeRequest], float | None] | None = None,
) -> list[float | None | Exception]:
    """``sigma_for`` of every request, in order, the CF model scored once per user and
    history (requests for one user's candidates share it: one ``score_history`` instead of
    one per pair). A request whose sigma fails comes back as its exception; a ``RunFault``
    is raised. ``single``: what scores one request (default ``sigma_for``; a judge passes
    its own method, so a subclass's override holds for every path)."""
    single = single or (lambda r: sigma_for(config, cf, r))

    def one(r: JudgeRequest) -> float | None | Exception:
        try:
            return single(r)
        except RunFault:
            raise
        except RECORDED_ERRORS as e:
            return e

    out: list[float | None | Exception] = [None] * len(reqs)
    groups: dict[tuple[str, tuple[str, ...]], list[int]] = {}
    # a history's item ids once per history list (one user's requests share one list)
    ids: dict[int, tuple[list[Any], tuple[str, ...]]] = {}
    for n, r in enumerate(reqs):
        if r.sigma is not None or not config.uses_cf() or cf is None:
            out[n] = one(r)
            continue
        got = ids.get(id(r.history))
        if got is None or got[0] is not r.history:
            got = ids[id(r.history)] = (r.history, tuple(h.item_id for h in r.history))
        groups.setdefault((r.user_id, got[1]), []).append(n)
    for (user, hist), idx in groups.items():
        try:
            got = cf.sigmas(list(hist), [reqs[n].candidate_id for n in idx], user)
        except RunFault:
            raise
        except RECORDED_ERRORS:  # pair by pair, so that only the failing ones fail
            for n in idx:
                out[n] = one(reqs[n])
            continue
        for n, v in zip(idx, got.tolist(), strict=True):
            out[n] = float(v)
    return out
