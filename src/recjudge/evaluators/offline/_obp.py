"""Interop with Open Bandit Pipeline: the estimators' inputs as obp's arrays
(``to_obp``) and files (``export_obp``), so obp's own estimators reproduce ours."""

from __future__ import annotations

import io
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from recjudge._util import atomic_write_bytes, atomic_write_text, path_component
from recjudge.evaluators.offline._estimators import LINEAR, ListLabels, metric_weights, parse_metric
from recjudge.evaluators.offline._evaluation import run_lists
from recjudge.evaluators.offline._propensities import Propensities


def to_obp(lists: Mapping[str, ListLabels], metric: str) -> dict[str, np.ndarray]:
    """One system's lists as the logged bandit feedback of Open Bandit Pipeline (``obp``,
    Saito et al., NeurIPS 2021 datasets track), so that obp's ``DirectMethod``,
    ``InverseProbabilityWeighting``, ``SelfNormalizedInverseProbabilityWeighting`` and
    ``DoublyRobust`` give this module's ``dm``, ``ips``, ``snips`` and ``dr`` of a linear
    ``metric@k`` (equal to rounding; ``tests/evaluators/test_obp.py`` checks it against obp's
    own output).

    The mapping: every top-k slot ``(u, r)`` of the ``U`` users is one round (``R`` rounds
    in all); its two actions are "the listed item's label is observed" (0) and "it is not"
    (1). The logging policy chose the logged action with probability ``pscore = theta_r``
    (observed) or ``1 - theta_r`` (not; floored at 1e-12 where ``theta_r = 1``, which the true
    propensities never give an unobserved slot); the evaluation policy always picks action
    0 (``action_dist[:, 0, 0] = 1``). The reward of an observed slot is ``s_r Y_r``, 0
    otherwise; ``estimated_rewards_by_reg_model[:, 0, 0] = s_r p_r`` (the judge), with
    ``s_r = (R / U) w_r`` so that obp's mean over rounds is the mean over users of
    ``sum_r w_r (.)``. Unobserved slots then add nothing to IPS and no correction to DR.

    Returns:
        ``action_dist`` (R, 2, 1), ``action``, ``reward``, ``pscore``, ``position`` (R,),
        ``estimated_rewards_by_reg_model`` (R, 2, 1): the keyword arguments of obp's
        ``estimate_policy_value``.

    Raises:
        ValueError: a nonlinear metric, or a slot without the judge's probability.
    """
    base, k = parse_metric(metric)
    if base not in LINEAR:
        raise ValueError(f"obp's estimators weigh sums of labels: use one of {', '.join(LINEAR)}")
    w = metric_weights(base, k)
    slots = [(x, r) for u in sorted(lists) for x in [lists[u]]
             for r in range(min(k, len(x.observed)))]  # fmt: skip
    n_rounds, n_users = len(slots), len(lists)
    if not n_rounds:
        raise ValueError("no listed slot to export")
    scale = np.array([n_rounds / n_users * w[r] for _, r in slots])
    obs = np.array([bool(x.observed[r]) for x, r in slots])
    theta = np.array([float(x.propensity[r]) for x, r in slots])
    p = np.array([float(x.p[r]) for x, r in slots])
    if np.isnan(p).any():
        raise ValueError(f"{int(np.isnan(p).sum())} listed pairs have no judge probability: "
                         "run impute with --judge-logged")  # fmt: skip
    y = np.array([float(x.label[r]) if x.observed[r] else 0.0 for x, r in slots])
    action_dist = np.zeros((n_rounds, 2, 1))
    action_dist[:, 0, 0] = 1.0
    q = np.zeros((n_rounds, 2, 1))
    q[:, 0, 0] = scale * p
    return {
        "action_dist": action_dist,
        "action": np.where(obs, 0, 1).astype(int),
        "reward": scale * y * obs,
        "pscore": np.where(obs, theta, np.maximum(1.0 - theta, 1e-12)),
        "position": np.zeros(n_rounds, dtype=int),
        "estimated_rewards_by_reg_model": q,
    }


def export_obp(
    runs: Sequence[Any],
    logged: Mapping[str, Mapping[str, int]],
    judged: Mapping[tuple[str, str], tuple[float, bool]],
    propensities: Propensities,
    users: Sequence[str],
    metrics: Sequence[str],
    folder: str | Path,
) -> list[Path]:
    """``to_obp`` for every run and linear metric, one ``.npz`` each in ``folder`` (numpy's
    archive: load it with ``np.load(path, allow_pickle=False)`` and pass its arrays to obp's
    ``estimate_policy_value``), listed in ``folder/index.json`` with the run name, metric and
    propensity model. File names percent-encode the run name (any id is safe)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    linear = [m for m in metrics if parse_metric(m)[0] in LINEAR]
    if not linear:
        raise ValueError("obp export needs a linear metric (precision, dcg or ndcg@K)")
    k = max(parse_metric(m)[1] for m in linear)
    index, written = [], []
    for run, (lists, _) in zip(runs, run_lists(runs, logged, judged, propensities, users, k),
                               strict=True):  # fmt: skip
        for m in linear:
            path = folder / f"{path_component(run.name)}__{m.replace('@', '_at_')}.npz"
            buf = io.BytesIO()  # whole, then renamed in: a kill never leaves half an archive
            np.savez(buf, **to_obp(lists, m))
            atomic_write_bytes(path, buf.getvalue())
            index.append({"run": run.name, "metric": m, "file": path.name,
                          "propensity": propensities.describe})  # fmt: skip
            written.append(path)
    atomic_write_text(folder / "index.json", json.dumps(index, indent=1) + "\n")
    return written
