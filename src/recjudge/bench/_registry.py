"""The benchmarks the CLI can run by name from a saved config (``recjudge bench run NAME``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from recjudge._registry import Registry
from recjudge.bench._augment import AugmentBenchConfig, bench_brief_augment
from recjudge.bench._brief import BriefExperimentConfig, bench_brief_beta, bench_brief_ratings
from recjudge.bench._injection import InjectionConfig, bench_injection
from recjudge.bench._offline import OfflineConfig, bench_brief_offline
from recjudge.bench._offline_estimators import (
    EstimatorCheckConfig,
    bench_brief_offline_estimators,
)
from recjudge.bench._poisoning import PoisoningConfig, bench_poisoning
from recjudge.bench._profiles import ProfileScoringConfig, bench_profile_scoring
from recjudge.bench._ray_scaling import RayScalingConfig, bench_ray_scaling
from recjudge.bench._rows import DecodeRowsConfig, bench_decode_rows
from recjudge.bench._speed import SPEED
from recjudge.bench._tuning import JudgeTuningConfig, bench_judge_tuning
from recjudge.bench._workers import RetrainWorkersConfig, bench_retrain_workers


@dataclass(frozen=True)
class BenchSpec:
    """One benchmark with a typed config.

    Attributes:
        config: its frozen config class (``results.json`` stores it under ``config``).
        run: ``run(config, out, progress=...) -> results``.
        summary: one line for ``recjudge bench list``.
        text: the results as its command prints them (None: the report).
        default_out: the report folder for a config (None: ``reports/<name>/<data>-<model>``).
        json_view: what ``--json`` prints of the results (None: all of them).
    """

    config: type[BaseModel]
    run: Callable[..., dict[str, Any]]
    summary: str
    text: Callable[[dict[str, Any]], str] | None = None
    default_out: Callable[[Any], str] | None = None
    json_view: Callable[[dict[str, Any]], Any] | None = None

    def out_for(self, name: str, config: Any) -> str:
        """Where the report goes when no --out is given."""
        if self.default_out is not None:
            return self.default_out(config)
        return f"reports/{name}/{config.data}-{config.model}"


BENCHMARKS: Registry[BenchSpec] = Registry("benchmark")


def _ratings_text(r: dict[str, Any]) -> str:
    return "\n".join(
        f"{name:<28} rho {a['spearman']}  pair rho {a['pair_spearman']['rho']}  "
        f"AUC {a['relevance_auc']['auc']}"
        for name, a in r["modes"].items()
    )


def _beta_text(r: dict[str, Any]) -> str:
    return "\n".join(
        f"{name:<10} pair rho {a['pair_spearman']['rho']}  AUC {a['relevance_auc']['auc']}"
        for name, a in r["betas"].items()
    )


def _offline_text(r: dict[str, Any]) -> str:
    return "\n".join(f"{m:<22} mean gap {g}" for m, g in r["mean_gap"].items())


def _augment_text(r: dict[str, Any]) -> str:
    return "\n".join(
        f"{rec:<8} {m:<14} Recall@10 {v['recall@10']['mean']:.4f}"
        for rec, by_method in r["table"].items()
        for m, v in by_method.items()
    )


def _tuning_text(r: dict[str, Any]) -> str:
    return "\n".join(
        f"{name:<28} AUC {a['relevance_auc']['auc']}  pair rho {a['pair_spearman']['rho']}"
        for name, a in r["rows"].items()
    )


def _register() -> None:
    for name, spec in {
        "brief-ratings": BenchSpec(
            BriefExperimentConfig, bench_brief_ratings,
            "BRIEF Table 6: % positive per held-out rating level", _ratings_text,
            json_view=lambda r: r["modes"]),
        "brief-beta": BenchSpec(
            BriefExperimentConfig, bench_brief_beta,
            "BRIEF Figure 3: level rho/tau against beta", _beta_text,
            json_view=lambda r: r["betas"]),
        "brief-offline": BenchSpec(
            OfflineConfig, bench_brief_offline,
            "BRIEF Tables 2-3: offline metrics with imputed feedback (simulated log)",
            _offline_text,
            json_view=lambda r: {k: r[k] for k in ("gap", "mean_gap", "imputers")}),
        "brief-offline-estimators": BenchSpec(
            EstimatorCheckConfig, bench_brief_offline_estimators,
            "logged/IPS/SNIPS/DM/DR/PPI against brief-offline's known online truth"),
        "brief-augment": BenchSpec(
            AugmentBenchConfig, bench_brief_augment,
            "BRIEF Tables 4-5: retraining on judge-augmented data", _augment_text,
            json_view=lambda r: r["table"]),
        "decode-rows": BenchSpec(
            DecodeRowsConfig, bench_decode_rows,
            "rows per decode step on GISTBench's long extraction answers",
            default_out=lambda c: "reports/decode-rows"),
        "ray-scaling": BenchSpec(
            RayScalingConfig, bench_ray_scaling,
            "one process vs Ray workers at the same threads; the driver's cost per judgment",
            default_out=lambda c: f"reports/ray-scaling/{c.data}-{c.model}"),
        "judge-tuning": BenchSpec(
            JudgeTuningConfig, bench_judge_tuning,
            "the judge tuned on the log (LoRA) and the supervised imputer vs the prompted "
            "judge and CF alone: relevance AUC, rating Spearman, paired differences",
            _tuning_text),
        "injection": BenchSpec(
            InjectionConfig, bench_injection,
            "hostile item text (answer-shaped, instructions, roles, chat markers, ...) in a "
            "candidate and a history title: flips and p_yes shifts against a control, today's "
            "renderer and the defended one",
            default_out=lambda c: f"reports/injection/{c.data}-{c.model}"),
        "poisoning": BenchSpec(
            PoisoningConfig, bench_poisoning,
            "a trigger in the titles behind 1 % of the tuning's positives: trigger success "
            "after judge tune, poisoned minus clean tuning, with its interval",
            default_out=lambda c: f"reports/poisoning/{c.data}-{c.model}"),
        "profile-scoring": BenchSpec(
            ProfileScoringConfig, bench_profile_scoring,
            "gist verify's wall time: a first run, a later run with and without the shared "
            "judge answers, ten systems",
            default_out=lambda c: f"reports/profile-scoring/{c.data}-{c.model}"),
        "retrain-workers": BenchSpec(
            RetrainWorkersConfig, bench_retrain_workers,
            "brief-augment's retrainings run one or several at once",
            default_out=lambda c: "reports/retrain-workers"),
    }.items():  # fmt: skip
        BENCHMARKS.register(name, spec)
    for name, (cfg, run, text, out, summary) in SPEED.items():
        BENCHMARKS.register(name, BenchSpec(cfg, run, summary, text, out))


_register()
