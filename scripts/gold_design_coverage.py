"""Coverage of the gold designs' PPI intervals at a team's gold budget (issue 109, item 5).

A synthetic world with a known truth (``tests/evaluators/test_small_sample.py``'s: users whose
relevance shares a taste, so labels cluster by user; three systems of different quality; a
judge that tracks relevance in part). Per replication a new world (its own seed), a gold
sample drawn by ``gold sample``'s code (``sample_gold``) under each design and size, labelled
with the world's truth, read by ``evaluate``'s ``ppi_run`` (default intervals); per cell the
share of 95 % intervals that hold the systems' true metric over the evaluation users, the share
refused (too few labelled users or labels of a class), and the mean width.

    .venv/bin/python scripts/gold_design_coverage.py --reps 200 --out reports/gold-design-coverage

Writes ``results.json`` and ``README.md`` (a table) under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from recjudge.evaluators import GoldSample, listed_pairs, ppi_run, sample_gold
from recjudge.evaluators.offline._estimators import metric_weights, parse_metric

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import synthetic_world  # noqa: E402 - the tests' world, found through the line above

DESIGNS = ("users", "uniform", "stratified", "active")
SIZES = (100, 300, 1000)
METRICS = ("precision@10", "ndcg_fixed@10")


def world(seed: int):
    """``tests/synthetic_world.py``'s world (one definition for the tests and this run)."""
    runs, users, rel, judged, _ = synthetic_world.world(seed)
    return runs, users, rel, {key: (p, p > 0.5) for key, (p, _) in judged.items()}


def truth(run, users, rel, metric: str) -> float:
    base, k = parse_metric(metric)
    w = metric_weights(base, k)
    return float(np.mean([sum(w[r] * rel[(u, i)] for r, i in enumerate(run.rankings[u][:k]))
                          for u in users]))  # fmt: skip


def cell(design: str, n: int, reps: int) -> dict:
    hits = refused = total = 0
    widths: list[float] = []
    for rep in range(reps):
        runs, users, rel, judged = world(10_000 + rep)
        rows = sample_gold(
            runs,
            users,
            10,
            n,
            design=design,
            seed=rep,
            judged=judged if design in ("stratified", "active") else None,
        )
        keys = [(r["user_id"], r["item_id"]) for r in rows]
        gold = GoldSample({key: rel[key] for key in keys},
                          {key: float(r["inclusion_prob"]) for key, r in zip(keys, rows,
                                                                             strict=True)},
                          design=design)  # fmt: skip
        frame = len(listed_pairs(runs, users, 10))
        for run in runs:
            for m in METRICS:
                total += 1
                try:
                    e = ppi_run(run, users, judged, gold, m, frame)
                except ValueError:
                    refused += 1
                    continue
                lo, hi = e.ci
                hits += lo <= truth(run, users, rel, m) <= hi
                widths.append(hi - lo)
    given = total - refused
    return {"design": design, "pairs": n, "intervals": given, "refused": refused,
            "coverage": hits / given if given else None,
            "mean_width": float(np.mean(widths)) if widths else None}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--out", default="reports/gold-design-coverage")
    args = ap.parse_args()
    t0 = time.perf_counter()
    rows = []
    for design in DESIGNS:
        for n in SIZES:
            rows.append(cell(design, n, args.reps))
            r = rows[-1]
            print(f"{design:10s} {n:5d}: coverage {r['coverage']}, refused {r['refused']}, "
                  f"width {r['mean_width']}", flush=True)  # fmt: skip
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    seconds = round(time.perf_counter() - t0, 1)
    (out / "results.json").write_text(json.dumps({"reps": args.reps, "metrics": METRICS,
                                                  "seconds": seconds, "cells": rows},
                                                 indent=1) + "\n")  # fmt: skip
    lines = ["# Gold designs' PPI coverage at 100-1,000 gold pairs (synthetic world)", "",
             f"`scripts/gold_design_coverage.py --reps {args.reps}`: per cell {args.reps} worlds "
             f"x 3 systems x {len(METRICS)} metrics ({', '.join(METRICS)}); {seconds} s.", "",
             "| design | gold pairs | 95 % intervals | coverage | refused | mean width |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        cov = "n/a" if r["coverage"] is None else f"{r['coverage']:.1%}"
        width = "n/a" if r["mean_width"] is None else f"{r['mean_width']:.3f}"
        lines.append(f"| {r['design']} | {r['pairs']} | {r['intervals']} | {cov} | "
                     f"{r['refused']} | {width} |")  # fmt: skip
    (out / "README.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
