"""The benchmarks the CLI can run by name from a saved config (``recjudge bench run NAME``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from recjudge._registry import Registry


@dataclass(frozen=True)
class BenchSpec:
    """One benchmark with a typed config.

    Attributes:
        config: its frozen config class (``results.json`` stores it under ``config``).
        run: ``run(config, out, progress=...) -> results``.
        summary: one line for ``recjudge bench list``.
    """

    config: type[BaseModel]
    run: Callable[..., dict[str, Any]]
    summary: str


BENCHMARKS: Registry[BenchSpec] = Registry("benchmark")


def _register() -> None:
    from recjudge.bench._augment import AugmentBenchConfig, bench_brief_augment
    from recjudge.bench._brief import BriefExperimentConfig, bench_brief_beta, bench_brief_ratings
    from recjudge.bench._offline import OfflineConfig, bench_brief_offline
    from recjudge.bench._offline_estimators import (
        EstimatorCheckConfig,
        bench_brief_offline_estimators,
    )
    from recjudge.bench._rows import DecodeRowsConfig, bench_decode_rows
    from recjudge.bench._workers import RetrainWorkersConfig, bench_retrain_workers

    for name, cfg, run, summary in (
        ("brief-ratings", BriefExperimentConfig, bench_brief_ratings,
         "BRIEF Table 6: % positive per held-out rating level"),
        ("brief-beta", BriefExperimentConfig, bench_brief_beta,
         "BRIEF Figure 3: level rho/tau against beta"),
        ("brief-offline", OfflineConfig, bench_brief_offline,
         "BRIEF Tables 2-3: offline metrics with imputed feedback (simulated log)"),
        ("brief-offline-estimators", EstimatorCheckConfig, bench_brief_offline_estimators,
         "logged/IPS/SNIPS/DM/DR/PPI against brief-offline's known online truth"),
        ("brief-augment", AugmentBenchConfig, bench_brief_augment,
         "BRIEF Tables 4-5: retraining on judge-augmented data"),
        ("decode-rows", DecodeRowsConfig, bench_decode_rows,
         "rows per decode step on GISTBench's long extraction answers"),
        ("retrain-workers", RetrainWorkersConfig, bench_retrain_workers,
         "brief-augment's retrainings run one or several at once"),
    ):  # fmt: skip
        BENCHMARKS.register(name, BenchSpec(cfg, run, summary))


_register()
