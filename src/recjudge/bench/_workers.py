"""Retrainings at once: ``brief-augment``'s retraining jobs run with each ``workers`` setting.

A retraining trains on one thread (so its numbers do not depend on the machine's thread
count), which leaves the other cores of a small machine idle during the longest part of
``brief-augment``. This runs the same jobs (the augmentation world of ``brief-augment``: its
users, candidates and the non-LLM methods' additions, so no LLM is needed) once per setting,
each into a fresh results folder, and reports the wall time per setting, retrainings per
hour, the ratio to the first setting, and whether every job's per-user metrics are identical
to the first setting's.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from recjudge._util import DistinctPositiveInts
from recjudge.bench._augment import AugmentBenchConfig, _heuristic_choice, _world
from recjudge.bench._retrain import RetrainJob, retrain_all
from recjudge.reporting import write_report


class RetrainWorkersConfig(BaseModel):
    """Settings of the ``retrain-workers`` benchmark.

    Attributes:
        data: dataset.
        users: augmented users (scored after each retraining; sampled as ``brief-augment``).
        rec: the recommender retrained (``sasrec``: the long one).
        sasrec_epochs: epochs per SASRec retraining (a cut of ``brief-augment``'s 30: the
            ratio does not depend on the epoch count, each epoch costs the same).
        seeds: seeds per method (jobs = seeds x methods).
        methods: non-LLM augmentation methods whose additions the jobs train on.
        workers: the settings compared.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    data: str = "ml-1m"
    users: int = Field(300, ge=1)
    rec: str = "sasrec"
    sasrec_epochs: int = Field(2, ge=1)
    seeds: int = Field(2, ge=1)
    methods: tuple[str, ...] = ("none", "random")
    workers: DistinctPositiveInts = (1, 2)

    @field_validator("methods")
    @classmethod
    def _no_llm(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        allowed = ("none", "random", "popularity", "cf-only")
        bad = [m for m in v if m not in allowed]
        if not v or bad:
            raise ValueError(f"methods must be among {', '.join(allowed)} (no LLM), got {bad}")
        return v


def bench_retrain_workers(
    config: RetrainWorkersConfig,
    out: str | Path = "reports/retrain-workers",
    progress: bool = True,
) -> dict[str, Any]:
    """Wall time of the same retraining jobs under each ``workers`` setting, with the share of
    jobs whose per-user metrics equal the first setting's; writes report.md and results.json."""
    aug = AugmentBenchConfig(
        data=config.data,
        users=config.users,
        methods=config.methods,
        retrain=(config.rec,),
        sasrec_epochs=config.sasrec_epochs,
        seeds=config.seeds,
    )
    w = _world(aug)
    data = w.retrain_data()
    jobs = [
        RetrainJob(config.rec, s, _heuristic_choice(aug, w, m, s))
        for s in range(config.seeds)
        for m in config.methods
    ]
    settings: dict[str, dict[str, Any]] = {}
    first: list[np.ndarray] | None = None
    for workers in config.workers:
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            got = retrain_all(aug, data, jobs, Path(tmp), workers, progress)
            seconds = time.perf_counter() - t0
        first = got if first is None else first
        settings[str(workers)] = {
            "seconds": seconds,
            "retrainings_per_hour": len(jobs) * 3600 / seconds,
            "identical_to_first": sum(
                bool(np.array_equal(a, b)) for a, b in zip(got, first, strict=True)
            ),
        }
    base = settings[str(config.workers[0])]["seconds"]
    results = {
        "config": config.model_dump(),
        "jobs": len(jobs),
        "users": len(w.users),
        "training_rows": len(w.past),
        "cores": len(os.sched_getaffinity(0)),
        "settings": settings,
        "ratios": {
            f"workers {k} vs {config.workers[0]}": base / s["seconds"]
            for k, s in settings.items()
            if k != str(config.workers[0])
        },
    }
    write_report(out, results, _report_lines(results))
    return results


def _report_lines(res: dict[str, Any]) -> list[str]:
    c, n = res["config"], res["jobs"]
    epochs = f", {c['sasrec_epochs']} epochs each" if c["rec"] == "sasrec" else ""
    lines = [
        f"# Retrainings at once ({c['rec']} on {c['data']}, {res['cores']} cores)",
        "",
        f"{n} `brief-augment` retraining jobs ({c['rec']}{epochs}; {c['seeds']} seeds x "
        f"{', '.join(c['methods'])}; {res['training_rows']} past interactions plus each "
        f"method's additions; {res['users']} augmented users scored after each), run once per "
        "setting into a fresh results folder. Each job trains on one thread in its own "
        "process when workers > 1. One pass per setting: a ratio between recjudge's own "
        "settings.",
        "",
        "| workers | seconds | retrainings per hour | identical to first |",
        "|---|---|---|---|",
    ]
    for k, s in res["settings"].items():
        lines.append(
            f"| {k} | {s['seconds']:.1f} | {s['retrainings_per_hour']:.1f} "
            f"| {s['identical_to_first']}/{n} |"
        )
    lines += ["", *(f"- {k}: **{v:.2f}x** retrainings per hour" for k, v in res["ratios"].items())]
    return lines
