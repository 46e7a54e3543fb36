"""PPI's pair-design interval on the known-truth bench's gold samples, symmetric against Hall's
skewness-corrected one, by how many relevant gold labels each system's lists hold.

For every evaluation with gold (the bench's seeds), gold size and pair design (``uniform``,
``active``), system and metric: the design-based PPI of ``evaluate --gold`` on the judge's
raw ``p_yes`` (``ppi_user_totals`` on ``_weighted_user_totals``, lambda as ``ppi_run`` picks
it), its symmetric ``t`` interval and Hall's, held against the population truth (every
sample read by the design-based estimator: ``ppi_run`` takes the iid one for a uniform sample
in which no user holds two of a run's gold pairs, about 5 % of them here). Writes
``OUT/ppi_interval_diag.json``: coverage per (design, size, metric) and per count of relevant
gold labels, each with and without ``MIN_CLASS_LABELS``. Needs the 1.5B preset and the
checkpoint's store:

    recjudge models install qwen2.5-coder-1.5b
    recjudge store import checkpoints/brief-offline-ml1m-1.5b/store.ckpt.gz --into OUT/store.sqlite
    .venv/bin/python scripts/ppi_interval_diag.py OUT

Last run (2026-12-07, 2-core EPYC, ~3 min): read in
reports/brief-offline-estimators/ml-1m-qwen2.5-coder-1.5b/README.md, section "Rerun 2026-12-07".
"""

import argparse
import json
from pathlib import Path

import numpy as np

from recjudge._util import rng
from recjudge.bench import _offline_estimators as oe
from recjudge.evaluators import listed_pairs, parse_metric
from recjudge.evaluators.offline._estimators import metric_weights
from recjudge.evaluators.offline._gold_ppi import (
    MIN_CLASS_LABELS,
    MIN_TUNED_CLUSTERS,
    _weighted_user_totals,
)
from recjudge.evaluators.offline._ppi import ppi_user_totals

CONFIG = Path(__file__).resolve().parents[1] / "checkpoints/brief-offline-ml1m-1.5b/estimators.json"
JUDGE = "judge:brief"
BINS = ((1, 1), (2, 2), (3, 5), (6, 10), (11, 20), (21, 10**9))


def _cells(world, runs, gold, judged, metric, frame, truth) -> list[dict]:
    """One record per run: truth, relevant and gold labels, both intervals' coverage
    (``judged``: the judge's probability per listed pair)."""
    base, k = parse_metric(metric)
    w = metric_weights(base, k)
    out = []
    for run in runs:
        held = [(u, gold.labels[(u, i)]) for u in world.users
                for i in run.rankings.get(u, [])[:k] if (u, i) in gold.labels]  # fmt: skip
        mine = [y for _, y in held]
        holders = {u for u, _ in held}
        if len(mine) < 2 or min(sum(mine), len(mine) - sum(mine)) == 0:
            continue  # too few or one class: refused either way
        lam = None if len(holders) >= MIN_TUNED_CLUSTERS else 1.0
        totals = _weighted_user_totals(run, world.users, judged, gold, k, w, frame)
        t = truth[metric][run.name]
        rec = {"pos": int(sum(mine)), "neg": len(mine) - int(sum(mine))}
        for skew in (False, True):
            e = ppi_user_totals(*totals, lam=lam, holders=len(holders), skew=skew)
            rec["hall" if skew else "symmetric"] = bool(e["lo"] <= t <= e["hi"])
            rec[f"width_{'hall' if skew else 'symmetric'}"] = e["hi"] - e["lo"]
        out.append(rec)
    return out


def _summary(recs: list[dict]) -> dict:
    def cov(rs: list[dict]) -> dict:
        if not rs:
            return {"intervals": 0}
        return {"intervals": len(rs), "symmetric": float(np.mean([r["symmetric"] for r in rs])),
                "hall": float(np.mean([r["hall"] for r in rs])),
                "width_ratio": float(np.mean([r["width_hall"] for r in rs])
                                     / np.mean([r["width_symmetric"] for r in rs]))}  # fmt: skip

    kept = [r for r in recs if min(r["pos"], r["neg"]) >= MIN_CLASS_LABELS]
    return {"all": cov(recs), f"at least {MIN_CLASS_LABELS} of each class": cov(kept),
            "by_relevant_gold_labels": {f"{lo}-{hi}" if hi < 10**9 else f"{lo}+": cov(
                [r for r in recs if lo <= r["pos"] <= hi]) for lo, hi in BINS}}  # fmt: skip


def main(out: Path) -> None:
    cfg = oe.EstimatorCheckConfig(**json.loads(CONFIG.read_text()))
    ds, past, users, world, sources = oe.world_of(cfg)
    oe.judge_world(cfg, ds, past, world, sources, out, None, True)
    truth = oe.truth_of(world, cfg.metrics)
    recs: dict[tuple[str, int, str], list[dict]] = {}
    for t in range(cfg.gold_draws):  # the bench's evaluations with gold, its seeds
        g = rng("estimator-log", (cfg.seed, t))
        w = oe.resample(world, g.integers(0, len(world.users), cfg.users_per_log or len(users)))
        runs = oe.runs_of(w)
        p, h = w.imputers[JUDGE]
        base = {pair: (float(a), bool(b)) for pair, a, b in zip(w.pairs, p, h, strict=True)}
        index = {pair: n for n, pair in enumerate(w.pairs)}
        k = max(parse_metric(m)[1] for m in cfg.metrics)
        frame = len(listed_pairs(runs, w.users, k))
        for n in cfg.gold_sizes:
            for design in ("uniform", "active"):
                gold = oe.draw_gold(w, runs, k, n, design, t, index, base)
                for metric in cfg.metrics:
                    recs.setdefault((design, n, metric), []).extend(
                        _cells(w, runs, gold, base, metric, frame, truth)
                    )
    every = [r for rs in recs.values() for r in rs]
    summary = {
        "overall": _summary(every),
        "cells": {f"{d} {n} {m}": _summary(rs) for (d, n, m), rs in recs.items()},
    }
    (out / "ppi_interval_diag.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary["overall"], indent=1))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="folder holding store.sqlite (the imported checkpoint)")
    main(ap.parse_args().out)
