"""Reproducible experiments and performance benchmarks that write reports."""

from recjudge.bench._decoding import bench_decoding
from recjudge.bench._report import environment, write_report

__all__ = ["bench_decoding", "environment", "write_report"]
