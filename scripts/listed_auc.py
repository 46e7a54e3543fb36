"""How well tuned judges rank the known-truth world's listed pairs (issue 88): the AUC against
the online truth over the listed pairs of a seeded sample of the world's users, per judge
model, with user-bootstrap intervals and paired differences on the same pairs.

``bench brief-offline-estimators`` judges all 12,145 listed pairs of its 200 users (46 min
per model in fp32 here) before estimating; when the question is only whether one tuning
ranks listed pairs better than another, a sample of users answers it at a quarter of the
cost, on exactly the pairs, prompts and settings the bench judges (its world, its
``judge_world``, its store, so the bench's own store replays a model it already judged).

    .venv/bin/python scripts/listed_auc.py OUT LABEL=MODEL[@STORE_DIR] [LABEL=MODEL...] \
        [--users N] [--config RESULTS_JSON]

``MODEL`` is a tuned folder (its card is checked against the world's users, as the bench
does) or a preset; ``@STORE_DIR`` seeds that model's store with a bench run's
``store.sqlite`` (its judgments replay). Writes ``OUT/results.json`` and ``OUT/report.md``.
The AUCs: ``judge:no-behavior`` is the model alone, ``judge:brief`` the model with the CF
bias (sigma from the world's ALS), ``cf`` sigma alone; each with a 95 % percentile
interval over 1,000 resamples of the sampled users (their pairs together), and each model's
difference with the first model's on the same resamples.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import time
from pathlib import Path

import numpy as np

from recjudge._stats import bootstrap_ci, labelled_auc, user_draws
from recjudge.bench._offline_estimators import (
    EstimatorCheckConfig,
    judge_world,
    tuned_judge,
    world_of,
)
from recjudge.data import sample_users

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "reports/brief-offline-estimators/ml-1m-qwen2.5-coder-0.5b-tuned/results.json"


def _boot(scores: dict[str, np.ndarray], y: np.ndarray, owner: np.ndarray, n_users: int,
          draws: int, seed: int) -> dict[str, list[float]]:  # fmt: skip
    """Per score, its AUC on each resample of users (a user drawn twice counts twice)."""
    by_user = [np.flatnonzero(owner == r) for r in range(n_users)]
    out: dict[str, list[float]] = {k: [] for k in scores}
    for rows in user_draws(n_users, draws, seed):
        idx = np.concatenate([by_user[r] for r in rows])
        for k, p in scores.items():
            a = labelled_auc(p[idx], y[idx])  # None: a resample of one class
            out[k].append(np.nan if a is None else a)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("models", nargs="+", help="LABEL=MODEL[@STORE_DIR]")
    ap.add_argument("--users", type=int, default=50)
    ap.add_argument("--config", type=Path, default=CONFIG)
    ap.add_argument("--draws", type=int, default=1000)
    a = ap.parse_args()
    raw = json.loads(a.config.read_text())["config"]
    base = EstimatorCheckConfig(**{k: v for k, v in raw.items()
                                   if k in EstimatorCheckConfig.model_fields})  # fmt: skip
    t0 = time.time()
    ds, past, users, world, sources = world_of(base)
    chosen = set(sample_users(users, a.users, ("listed-auc", base.seed)))
    keep = [n for n, (u, _) in enumerate(world.pairs) if u in chosen]
    order = [u for u in users if u in chosen]
    row = {u: r for r, u in enumerate(order)}
    owner = np.array([row[world.pairs[n][0]] for n in keep])
    y = world.relevant[keep]
    sub = dataclasses.replace(world, pairs=[world.pairs[n] for n in keep], imputers={})
    print(f"world built in {time.time() - t0:.0f} s: {len(keep)} listed pairs of "
          f"{len(chosen)} users, {int(y.sum())} relevant")  # fmt: skip
    scores = {"cf": world.imputers["cf"][0][keep]}
    models = {}
    for spec in a.models:
        label, _, rest = spec.partition("=")
        model, _, store = rest.partition("@")
        config = base.model_copy(update={"model": model})
        folder = a.out / label
        folder.mkdir(parents=True, exist_ok=True)
        if store and not (folder / "store.sqlite").exists():
            for f in Path(store).glob("store.sqlite*"):
                shutil.copy(f, folder / f.name)
        card = tuned_judge(config, users)  # a tuning that read the world is refused
        sub.imputers = {}
        judged = judge_world(config, ds, past, sub, sources, folder, None, True)
        models[label] = {"model": model, "tuned_judge": card, "judging": judged}
        for name, (p, _) in sub.imputers.items():
            scores[f"{label}/{name}"] = p
        print(label, json.dumps(judged))
    boots = _boot(scores, y, owner, len(order), a.draws, base.seed)
    first = a.models[0].partition("=")[0]
    rows = {}
    for k, p in scores.items():
        b = np.asarray(boots[k])
        lo, hi = bootstrap_ci(b[np.isfinite(b)])
        rows[k] = {"auc": labelled_auc(p, y), "lo": lo, "hi": hi}
        label, _, judge = k.partition("/")
        ref = f"{first}/{judge}"
        if judge and label != first and ref in scores:
            d = b - np.asarray(boots[ref])
            lo, hi = bootstrap_ci(d[np.isfinite(d)])
            rows[k]["minus_" + first] = {"diff": rows[k]["auc"] - rows[ref]["auc"],
                                          "lo": lo, "hi": hi}  # fmt: skip
        if judge == "judge:brief":
            d = b - np.asarray(boots["cf"])
            lo, hi = bootstrap_ci(d[np.isfinite(d)])
            rows[k]["minus_cf"] = {"diff": rows[k]["auc"] - rows["cf"]["auc"], "lo": lo, "hi": hi}
    results = {"config": base.model_dump(), "users": len(order), "listed_pairs": len(keep),
               "relevant": int(y.sum()), "models": models, "auc": rows, "draws": a.draws,
               "seconds": round(time.time() - t0, 1)}  # fmt: skip
    (a.out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    lines = [f"# AUC on the known-truth world's listed pairs ({len(order)} of {len(users)} users,"
             f" {len(keep)} pairs, {int(y.sum())} relevant)", "",
             "| score | AUC vs online truth [95 % CI] | minus " + first + " | minus CF |",
             "|---|---|---|---|"]  # fmt: skip

    def cell(d: dict | None, key: str = "diff") -> str:
        return "" if not d else f"{d[key]:+.3f} [{d['lo']:+.3f}, {d['hi']:+.3f}]"

    for k, r in rows.items():
        lines.append(f"| {k} | {r['auc']:.3f} [{r['lo']:.3f}, {r['hi']:.3f}] | "
                     f"{cell(r.get('minus_' + first))} | {cell(r.get('minus_cf'))} |")  # fmt: skip
    (a.out / "report.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
