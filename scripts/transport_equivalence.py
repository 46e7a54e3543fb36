"""The transport check as an equivalence test, measured (issue 109, item 7).

A synthetic world in the known-truth bench's shape: 200 users, five systems' top-10 lists of
the same relevance distribution (so a calibration fitted anywhere transports to each: the honest
world), about 9 % relevant, a perfectly calibrated judge of AUC 0.8 (the bench's
``synthetic_imputer``: score ``s = r + tau e``, ``p = P(r = 1 | s)``). Planted: the judge's
probabilities of the first system's pairs shifted by +1.5 on the logit scale (the bench's
``PLANTED_SHIFT``: a lenient system). Per replication a uniform gold sample of the listed
pairs (``sample_gold``), labelled with the truth; an isotonic map fitted on it; ``evaluate``'s
check (``transport_check`` with the leave-system-out refit) against a margin. Per cell: how
often the planted system fails, how often honest systems (an unplanted world) pass and fail.

    .venv/bin/python scripts/transport_equivalence.py --reps 100 --out reports/transport-equivalence
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from recjudge.evaluators import RecRun, RunCheck, sample_gold
from recjudge.evaluators.offline._calibrate import apply_map, fit_isotonic
from recjudge.evaluators.offline._transport import transport_check

SIZES = (100, 300, 1000)
MARGINS = (0.02, 0.05, 0.1)
SHIFT = 1.5
AUC = 0.8


def world(seed: int, n_users: int = 200, k: int = 10, items: int = 1000, systems: int = 5):
    """Systems' lists, the truth per listed pair and the calibrated judge's probability."""
    from scipy.stats import norm

    g = np.random.default_rng(seed)
    taste, quality = g.normal(0, 1, n_users), g.normal(0, 1, items)
    tau = 1.0 / (np.sqrt(2.0) * norm.ppf(AUC))
    runs, rel = [], {}
    for s in range(systems):
        lists = {}
        for u in range(n_users):
            pool = g.choice(items, k, replace=False)
            lists[str(u)] = [str(i) for i in pool]
            for i in pool:
                key = (str(u), str(i))
                if key not in rel:
                    z = -2.8 + 0.8 * taste[u] + 0.6 * quality[i]
                    rel[key] = int(g.random() < 1 / (1 + np.exp(-z)))
        runs.append(RecRun(f"s{s}", "", lists, {}, RunCheck()))
    keys = list(rel)
    r = np.array([rel[key] for key in keys], dtype=float)
    base = float(r.mean())
    score = r + tau * g.standard_normal(len(r))
    # P(r = 1 | s): the two classes' score densities are N(1, tau) and N(0, tau)
    odds = base / (1 - base) * np.exp((score - 0.5) / tau**2)
    p = odds / (1 + odds)
    return runs, [str(u) for u in range(n_users)], rel, dict(zip(keys, p, strict=True))


def check(runs, users, rel, probs, n, seed, margin):
    rows = sample_gold(runs, users, 10, n, design="uniform", seed=seed)
    gold = {(x["user_id"], x["item_id"]): rel[(x["user_id"], x["item_id"])] for x in rows}
    keys = list(probs)
    xs, ys = fit_isotonic([probs[key] for key in gold], list(gold.values()))
    cal = dict(zip(keys, apply_map(xs, ys, [probs[key] for key in keys]), strict=True))

    def refit(labels):
        fx, fy = fit_isotonic([probs[key] for key in labels], list(labels.values()))
        return dict(zip(gold, apply_map(fx, fy, [probs[key] for key in gold]), strict=True))

    judged = {key: (float(v), False) for key, v in cal.items()}
    return transport_check(runs, users, judged, gold, 10, refit=refit, margin=margin)


def cell(n: int, margin: float, reps: int) -> dict:
    planted_fail, honest_pass, honest_fail, honest_n = 0, 0, 0, 0
    for rep in range(reps):
        runs, users, rel, p = world(20_000 + rep)
        mine = {(u, i) for u, v in runs[0].rankings.items() for i in v}
        z = {key: np.log(v / (1 - v)) for key, v in p.items()}
        lenient = {key: (1 / (1 + np.exp(-(z[key] + SHIFT))) if key in mine else v)
                   for key, v in p.items()}  # fmt: skip
        try:
            got = check(runs, users, rel, lenient, n, rep, margin)
            planted_fail += got["s0"]["verdict"] == "fail"
            honest = check(runs, users, rel, p, n, rep, margin)
        except ValueError:
            continue
        for d in honest.values():
            honest_n += 1
            honest_pass += d["verdict"] == "pass"
            honest_fail += d["verdict"] == "fail"
    return {"gold_pairs": n, "margin": margin, "reps": reps,
            "planted_fails": planted_fail / reps, "honest_pass": honest_pass / honest_n,
            "honest_fail": honest_fail / honest_n}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--out", default="reports/transport-equivalence")
    args = ap.parse_args()
    t0 = time.perf_counter()
    rows = []
    for margin in MARGINS:
        for n in SIZES:
            rows.append(cell(n, margin, args.reps))
            print(rows[-1], flush=True)
    seconds = round(time.perf_counter() - t0, 1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"seconds": seconds, "cells": rows},
                                                 indent=1) + "\n")  # fmt: skip
    lines = ["# The transport check as an equivalence test (synthetic world)", "",
             f"`scripts/transport_equivalence.py --reps {args.reps}` ({seconds} s).", "",
             "| margin | gold pairs | planted lenient system fails | honest systems pass | "
             "honest systems fail |", "|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        lines.append(f"| {r['margin']:g} | {r['gold_pairs']} | {r['planted_fails']:.0%} | "
                     f"{r['honest_pass']:.0%} | {r['honest_fail']:.1%} |")  # fmt: skip
    (out / "README.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
