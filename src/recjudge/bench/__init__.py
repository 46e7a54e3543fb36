"""Reproducible experiments and performance benchmarks that write reports."""

from recjudge.bench._augment import AugmentBenchConfig, bench_brief_augment
from recjudge.bench._brief import (
    BriefExperimentConfig,
    auc_ci,
    bench_brief_beta,
    bench_brief_ratings,
    level_correlations,
    level_table,
    spearman_ci,
)
from recjudge.bench._brief_stats import auc, level_ci, setting_difference
from recjudge.bench._cf import bench_cf
from recjudge.bench._decoding import bench_decoding
from recjudge.bench._latency import bench_latency
from recjudge.bench._offline import OfflineConfig, bench_brief_offline, gap, lift, ranking_metrics
from recjudge.bench._registry import BENCHMARKS, BenchSpec
from recjudge.bench._rows import DecodeRowsConfig, bench_decode_rows
from recjudge.bench._throughput import bench_throughput, matmul_flops
from recjudge.bench._workers import RetrainWorkersConfig, bench_retrain_workers
from recjudge.reporting import environment, write_report

__all__ = [
    "BENCHMARKS",
    "BenchSpec",
    "AugmentBenchConfig",
    "bench_brief_augment",
    "BriefExperimentConfig",
    "OfflineConfig",
    "bench_brief_offline",
    "gap",
    "lift",
    "ranking_metrics",
    "auc",
    "auc_ci",
    "bench_brief_beta",
    "bench_brief_ratings",
    "level_correlations",
    "level_table",
    "level_ci",
    "setting_difference",
    "spearman_ci",
    "bench_cf",
    "bench_decoding",
    "DecodeRowsConfig",
    "bench_decode_rows",
    "bench_latency",
    "RetrainWorkersConfig",
    "bench_retrain_workers",
    "bench_throughput",
    "environment",
    "matmul_flops",
    "write_report",
]
