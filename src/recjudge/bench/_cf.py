"""CF accuracy anchor: SASRec against the paper on ML-1M, with the classic baselines."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from recjudge._util import torch_threads
from recjudge.cf_models import (
    TrainOptions,
    evaluate_full,
    evaluate_sampled,
    history_at_test,
    load_model,
    train_cf,
    training_seconds,
)
from recjudge.data import leave_one_out, load_dataset
from recjudge.reporting import write_report

PAPER = {"hr@10": 0.8245, "ndcg@10": 0.5905}  # Kang & McAuley 2018, Table III, ML-1M


#: Models ``bench cf`` trains itself when no saved folder is given (seconds each on ML-1M);
#: the PyTorch models are trained with ``recjudge cf train`` and passed as saved folders.
QUICK = ("als", "bpr", "itemknn", "pop")


def bench_cf(
    sasrec_dir: str | Path,
    data: str = "ml-1m",
    seed: int = 0,
    threads: int = 2,
    out: str | Path = "reports/cf",
    saved: dict[str, str] | None = None,
    train: Sequence[str] = QUICK,
) -> dict[str, Any]:
    """Evaluate a trained SASRec, other saved models and freshly trained quick ones on one
    split.

    Protocols: sampled (target + 100 unseen negatives; HR@10, NDCG@10) and full ranking
    (Recall@10/20, NDCG@10/20). Train on the leave-one-out train split; at test time the
    history is train + validation, as Kang & McAuley.

    Args:
        sasrec_dir: SASRec folder from ``cf train sasrec`` (the anchor against the paper).
        saved: other saved model folders by row name (FM, DeepFM, LightGCN, NRMS, ...).
        train: registered models trained here with their default configs.
    """
    with torch_threads(threads):
        ds = load_dataset(data)
        split = leave_one_out(ds.interactions)
        models, train_seconds = _models(ds, sasrec_dir, saved or {}, train, seed, threads)
        rows = {name: _evaluate(m, split, seed) for name, m in models.items()}
    for name, r in rows.items():
        r["train_seconds"] = train_seconds[name]
        r["config"] = models[name].config.model_dump()
    sas = rows["sasrec"]
    gap = {k: sas[f"sampled_{k}"] - v for k, v in PAPER.items()}
    results = {
        "data": data,
        "seed": seed,
        "threads": threads,
        "paper_sasrec": PAPER,
        "gap_to_paper": gap,
        "within_0.02": all(abs(v) <= 0.02 for v in gap.values()),
        "sasrec_config": models["sasrec"].config.model_dump(),
        "sasrec_epochs": len(models["sasrec"].train_info.get("epochs", [])),
        "models": rows,
    }
    write_report(out, results, _lines(data, rows, results))
    return results


def _models(
    ds: Any,
    sasrec_dir: str | Path,
    saved: dict[str, str],
    train: Sequence[str],
    seed: int,
    threads: int,
) -> tuple[dict[str, Any], dict[str, float | None]]:
    """The models by row name and their whole training time (seconds)."""
    models: dict[str, Any] = {"sasrec": load_model(sasrec_dir)}
    models.update({name: load_model(path) for name, path in saved.items()})
    seconds = {name: training_seconds(m.train_info) for name, m in models.items()}
    for name in train:
        if name in models:
            continue
        t0 = time.perf_counter()
        models[name] = train_cf(
            name, ds, None, None, TrainOptions(seed=seed, threads=threads, progress=False)
        )
        seconds[name] = time.perf_counter() - t0
    return models, seconds


def _evaluate(model: Any, split: Any, seed: int) -> dict[str, Any]:
    hist, extra = history_at_test(split)  # train + validation, as Kang & McAuley
    s = evaluate_sampled(model, hist, split.test, extra_seen=extra, seed=seed)
    f = evaluate_full(model, hist, split.test, ks=(10, 20), extra_seen=extra)
    return {
        **{f"sampled_{k}": v for k, v in s.items() if k != "users"},
        **{f"full_{k}": v for k, v in f.items() if k != "users"},
        "users": s["users"],
    }


def _lines(data: str, rows: dict[str, Any], results: dict[str, Any]) -> list[str]:
    gap = results["gap_to_paper"]
    lines = [
        f"# CF accuracy anchor ({data})",
        "",
        "Leave-one-out; sampled = target + 100 unseen negatives (ties count against the "
        "target); full = all unseen items.",
        "",
        "| model | HR@10 (sampled) | NDCG@10 (sampled) | Recall@10 | NDCG@10 | Recall@20 "
        "| train s |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in rows.items():
        lines.append(
            f"| {name} | {r['sampled_hr@10']:.4f} | {r['sampled_ndcg@10']:.4f} | "
            f"{r['full_recall@10']:.4f} | {r['full_ndcg@10']:.4f} | "
            f"{r['full_recall@20']:.4f} | {r['train_seconds'] or 0:.0f} |"
        )
    lines += [
        "",
        f"SASRec vs the paper (HR@10 {PAPER['hr@10']}, NDCG@10 {PAPER['ndcg@10']}): "
        f"HR@10 {gap['hr@10']:+.4f}, NDCG@10 {gap['ndcg@10']:+.4f} "
        f"({'within' if results['within_0.02'] else 'outside'} 0.02), "
        f"{results['sasrec_epochs']} epochs on this CPU.",
    ]
    return lines
