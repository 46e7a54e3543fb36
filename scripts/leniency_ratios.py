"""The leniency rule's ratio on the known-truth bench's world: per simulated evaluation, sigma
source and system, the judge's YES rate on the system's unlabelled top-10 pairs over its logged
hit rate, divided by the other systems' median (what ``evaluate``'s rule compares with
``LENIENCY_LIMIT``). Writes the percentiles and the share flagged at several thresholds to
``OUT/leniency_ratios.json``. Needs the 1.5B preset and the checkpoint's store:

    recjudge models install qwen2.5-coder-1.5b
    recjudge store import checkpoints/brief-offline-ml1m-1.5b/store.ckpt.gz --into OUT/store.sqlite
    .venv/bin/python scripts/leniency_ratios.py OUT

Last run (2026-12-06, 2-core EPYC, 20 min): reports/brief-offline-estimators/
ml-1m-qwen2.5-coder-1.5b/leniency_ratios.json, read in that folder's README.
"""

import argparse
import json
from pathlib import Path

import numpy as np

from recjudge._util import rng
from recjudge.bench import _offline_estimators as oe
from recjudge.evaluators._circular import leniency_ratios

CONFIG = Path(__file__).resolve().parents[1] / "checkpoints/brief-offline-ml1m-1.5b/estimators.json"
THRESHOLDS = (1.1, 1.2, 1.3, 1.5, 2.0)


def main(out: Path) -> None:
    cfg = oe.EstimatorCheckConfig(**json.loads(CONFIG.read_text()))
    ds, past, users, world, sources = oe.world_of(cfg)
    oe.judge_world(cfg, ds, past, world, sources, out, None, True)
    imputers = oe.source_imputers(world, sources)
    got = {s: {n: [] for n in world.slots} for s in imputers}
    for t in range(cfg.simulated_logs):  # the bench's evaluations, its seeds
        g = rng("estimator-log", (cfg.seed, t))
        w = oe.resample(world, g.integers(0, len(world.users), cfg.users_per_log or len(users)))
        observed, logged = oe.simulate_log(w, g)
        chosen = oe.selections(w, logged, cfg.draws, cfg.seed + t, oe.runs_of(w))
        for s, imputer in imputers.items():
            rates = oe.leniency_rates(w, observed, chosen["listed"][0], imputer)
            for n, v in leniency_ratios(rates).items():
                got[s][n].append(v)
    kinds = {s.label: s.kind for s in sources}
    summary = {s: {"kind": kinds[s], "systems": {n: {
        "p10": float(np.percentile(v, 10)), "median": float(np.median(v)),
        "p90": float(np.percentile(v, 90)), "evaluations": len(v),
        "flagged_at": {f"{t:.1f}": float(np.mean(np.array(v) >= t)) for t in THRESHOLDS},
    } for n, v in by.items()}} for s, by in got.items()}  # fmt: skip
    (out / "leniency_ratios.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="folder holding store.sqlite (the imported checkpoint)")
    main(ap.parse_args().out)
