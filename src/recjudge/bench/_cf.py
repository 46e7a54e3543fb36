"""CF accuracy anchor: SASRec against the paper on ML-1M, with the classic baselines."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from recjudge.reporting import write_report

PAPER = {"hr@10": 0.8245, "ndcg@10": 0.5905}  # Kang & McAuley 2018, Table III, ML-1M


def bench_cf(
    sasrec_dir: str | Path,
    data: str = "ml-1m",
    seed: int = 0,
    threads: int = 2,
    out: str | Path = "reports/cf",
) -> dict[str, Any]:
    """Evaluate a trained SASRec and freshly trained ALS/BPR/ItemKNN/Pop on one split.

    Protocols: sampled (target + 100 unseen negatives; HR@10, NDCG@10) and full ranking
    (Recall@10/20, NDCG@10/20). Train on the leave-one-out train split; validation items are
    excluded from the candidates at test time.
    """
    import torch

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

    torch.set_num_threads(threads)
    ds = load_dataset(data)
    split = leave_one_out(ds.interactions)
    models: dict[str, Any] = {"sasrec": load_model(sasrec_dir)}
    train_seconds = {"sasrec": training_seconds(models["sasrec"].train_info)}
    for name in ("als", "bpr", "itemknn", "pop"):
        t0 = time.perf_counter()
        models[name] = train_cf(
            name, ds, None, None, TrainOptions(seed=seed, threads=threads, progress=False)
        )
        train_seconds[name] = time.perf_counter() - t0
    rows = {}
    for name, m in models.items():
        hist, extra = history_at_test(split)  # train + validation, as Kang & McAuley
        s = evaluate_sampled(m, hist, split.test, extra_seen=extra, seed=seed)
        f = evaluate_full(m, hist, split.test, ks=(10, 20), extra_seen=extra)
        rows[name] = {
            **{f"sampled_{k}": v for k, v in s.items() if k != "users"},
            **{f"full_{k}": v for k, v in f.items() if k != "users"},
            "users": s["users"],
            "train_seconds": train_seconds[name],
        }
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
    write_report(out, results, lines)
    return results
