"""How long ``recjudge evaluate --estimators`` takes at ML-1M's size: synthetic files in the
formats ``impute`` writes (qrels, ``imputed.jsonl`` with every listed pair judged, runs as
JSONL) for ``users`` x ``runs`` lists of ``k`` items, then the command itself in a fresh
process (imports, reading, ranx metrics, every estimator with its user bootstrap, the
report), timed per part: ranx's evaluation alone, then with every estimator."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from recjudge.reporting import write_report


def synthetic_evaluation(folder: Path, users: int, runs: int, k: int, seed: int = 0) -> str:
    """Write runs, qrels and a judged sidecar under ``folder``; return the ``--runs`` value.

    Every user has ~10 logged labels (a third relevant) over 3,700 items; every run lists
    ``k`` items per user; every listed pair has a judge probability (as ``impute
    --judge-logged`` writes)."""
    g = np.random.default_rng(seed)
    items = [f"i{n}" for n in range(3700)]
    imp = folder / "imputed"
    imp.mkdir(parents=True, exist_ok=True)
    logged: dict[str, dict[str, int]] = {}
    for u in range(users):
        picks = g.choice(len(items), 10, replace=False)
        logged[f"u{u}"] = {items[i]: int(g.random() < 0.33) for i in picks}
    spec, judged = [], {}
    for r in range(runs):
        path = folder / f"run{r}.jsonl"
        with open(path, "w", encoding="utf-8") as f:
            for u in range(users):
                lst = [items[i] for i in g.choice(len(items), k, replace=False)]
                for rank, i in enumerate(lst):
                    f.write(json.dumps({"user_id": f"u{u}", "item_id": i,
                                        "score": float(k - rank)}) + "\n")  # fmt: skip
                    judged.setdefault((f"u{u}", i), float(g.random()))
        spec.append(f"run{r}={path}")
    imputed = {u: dict(v) for u, v in logged.items()}
    with open(imp / "imputed.jsonl", "w", encoding="utf-8") as f:
        for (u, i), p in judged.items():
            f.write(json.dumps({"user_id": u, "item_id": i, "label": int(p > 0.5),
                                "p_yes": p}) + "\n")  # fmt: skip
            imputed[u].setdefault(i, int(p > 0.5))
    (imp / "qrels_logged.json").write_text(json.dumps(logged))
    (imp / "qrels_imputed.json").write_text(json.dumps(imputed))
    (imp / "summary.json").write_text(json.dumps({"calibrated": False}))
    return ",".join(spec)


def bench_estimator_speed(
    users: int = 6040,
    runs: int = 5,
    k: int = 20,
    repeats: int = 3,
    out: str | Path = "reports/estimator-speed",
) -> dict[str, Any]:
    """Median wall seconds of ``recjudge evaluate`` without and with ``--estimators`` (all
    six; metrics precision@k, ndcg@k, mrr@k, hit_rate@k; 1000 user resamples each) in fresh
    processes, and the import-only time; report.md + results.json under ``out``."""
    cli = str(Path(sys.executable).with_name("recjudge"))
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        t0 = time.perf_counter()
        spec = synthetic_evaluation(folder, users, runs, k)
        write_s = time.perf_counter() - t0
        base = [cli, "evaluate", "--runs", spec, "--qrels", str(folder / "imputed"), "--k",
                str(k), "--metrics", f"precision@{k},ndcg@{k},mrr@{k},hit_rate@{k}",
                "--json"]  # fmt: skip
        cmds = {
            "import only": [sys.executable, "-c", "import recjudge.cli"],
            "evaluate (ranx metrics, paired tests)": base,
            "evaluate --estimators (all six)": [
                *base,
                "--estimators",
                "logged,imputed,dm,ips,snips,dr",
            ],  # fmt: skip
        }
        walls: dict[str, list[float]] = {name: [] for name in cmds}
        for _ in range(repeats):  # alternated, so drift hits every command alike
            for name, cmd in cmds.items():
                t = time.perf_counter()
                proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp)
                walls[name].append(time.perf_counter() - t)
                if proc.returncode != 0:
                    raise RuntimeError(f"{name} failed:\n{proc.stderr[-2000:]}")
    med = {name: statistics.median(v) for name, v in walls.items()}
    extra = med["evaluate --estimators (all six)"] - med["evaluate (ranx metrics, paired tests)"]
    results = {
        "users": users,
        "runs": runs,
        "k": k,
        "repeats": repeats,
        "median_seconds": med,
        "runs_seconds": walls,
        "estimators_extra_seconds": extra,
        "writing_inputs_seconds": round(write_s, 2),
    }
    lines = [
        "# `evaluate --estimators` at ML-1M's size",
        "",
        f"Synthetic files in `impute`'s formats: {users} users x {runs} runs x top-{k} "
        f"({users * runs * k} listed slots, every listed pair judged), ~10 logged labels per "
        "user; each command in a fresh process (imports included), median of "
        f"{repeats} alternated runs. Metrics precision/ndcg/mrr/hit_rate@{k}; every estimator "
        "with a 95 % interval from 1000 user resamples; propensities powerlaw:0.5.",
        "",
        "| command | median wall s | runs |",
        "|---|---|---|",
    ]
    lines += [f"| {n} | {m:.2f} | {', '.join(f'{x:.2f}' for x in walls[n])} |"
              for n, m in med.items()]  # fmt: skip
    lines += ["", f"The estimators add {extra:.2f} s to the evaluation."]
    write_report(out, results, lines)
    return results
