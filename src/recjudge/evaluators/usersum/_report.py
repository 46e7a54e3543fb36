"""UserSumBench report: markdown lines and the metrics figure."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from recjudge._stats import verdict
from recjudge.evaluators._cost import cost_sentence
from recjudge.reporting import figure, interval


def plot_metrics(table: Mapping[str, Any], path: Path) -> None:
    """QM, IFM and mean task accuracy per summariser (mean +- sd over prediction runs)."""
    names = list(table)
    metrics = ("qm", "ifm", "task_accuracy")
    with figure(path, size=(7, 4), dpi=120) as ax:
        w = 0.8 / max(len(names), 1)
        for k, n in enumerate(names):
            xs = np.arange(len(metrics)) + k * w
            ax.bar(
                xs,
                [table[n][m]["mean"] for m in metrics],
                w,
                yerr=[table[n][m]["sd"] for m in metrics],
                capsize=3,
                label=n,
            )
        ax.set_xticks(np.arange(len(metrics)) + w * (len(names) - 1) / 2)
        ax.set_xticklabels(["QM", "IFM", "mean task accuracy"])
        ax.set_ylabel("score (mean +- sd over prediction runs)")
        ax.set_ylim(0, 1.05)
        ax.axhline(0.2, color="grey", ls=":", lw=1, label="chance per task (1/5)")
        ax.legend()
        ax.set_title("UserSumBench: summariser comparison")


def usersum_report(config: Any, data: str, results: Mapping[str, Any]) -> list[str]:
    """The report's markdown lines, deviations from the paper in the header."""
    t = results["table"]
    lines = [
        f"# UserSumBench on {data}",
        "",
        f"Summariser `{config.model}`, predictor `{config.predictor}`; {len(results['users'])} "
        f"users with >= {config.min_activities} activities (most recent {config.max_activities}, "
        f"last {config.future} held out as the future); word limit {config.word_limit}; "
        f"N_r = {config.recent}; Q_s needs {config.m}/4 tasks; {config.runs} prediction runs "
        f"(different option samples and orders), seed {config.seed}. Hierarchy: "
        f"{config.segmentation}-based segments of >= {config.min_segment} activities (at most "
        f"{config.max_segments}), "
        f"{config.critique_rounds} critique rounds, {config.qa_pairs} QA pairs per segment. "
        + _cost_line(results),
        "",
        "**Deviations from the paper:** "
        + ("; ".join(results.get("deviations", [])) or "none")
        + ". Prompts: ours, in the roles of appendix A.1-A.7 (not the paper's wording).",
        "",
        "| summariser | QM | IFM | IDM (x1000) | task acc. | words | ROUGE-2 | ROUGE-L | BLEU |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for n, v in t.items():
        lines.append(
            f"| {n} | {v['qm']['mean']:.3f} +- {v['qm']['sd']:.3f} | {v['ifm']['mean']:.3f} +- "
            f"{v['ifm']['sd']:.3f} | {1000 * v['idm']['mean']:.2f} +- {1000 * v['idm']['sd']:.2f} "
            f"| {v['task_accuracy']['mean']:.3f} | {v['words']:.0f} | {v['rouge2']:.3f} | "
            f"{v['rougeL']:.3f} | {v['bleu']:.3f} |"
        )
    lines += ["", "Per-task accuracy (all runs; chance = 0.2):", ""]
    for n, v in t.items():
        lines.append(
            f"- {n}: " + ", ".join(f"{k} {a:.3f}" for k, a in v["per_task_accuracy"].items())
        )
    lines += _interval_lines(results)
    lines += ["", "![metrics](metrics.png)"]
    return lines


def _cost_line(results: Mapping[str, Any]) -> str:
    """Wall time, and what this run asked the models (the rest was read from the store)."""
    labels = {
        "free_text": "free-text answers (summaries, regenerations)",
        "closed": "closed questions (predictions, verifier checks)",
    }
    return cost_sentence(results["wall_seconds"], results.get("cost") or {}, labels)


def _ci(c: Mapping[str, Any], scale: float = 1.0) -> str:
    return interval(None, c["lo"], c["hi"], signed=True, scale=scale)


_LABELS = {"qm": "QM", "ifm": "IFM", "idm": "IDM (x1000)", "task_accuracy": "task acc."}


def _interval_lines(results: Mapping[str, Any]) -> list[str]:
    """Each summariser's 95 % intervals, and hierarchy minus single paired on users and runs."""
    iv = results.get("intervals")
    if not iv:
        return []
    n = len(results["users"])
    lines = [
        "",
        f"95 % intervals: over the {n} users (bootstrap, users resampled) and over the "
        "prediction runs (Student t; the summaries are the same in every run, so this "
        "interval holds the option sampling only):",
        "",
        "| summariser | metric | mean | users 95 % CI | runs 95 % CI |",
        "|---|---|---|---|---|",
    ]
    for name, cells in iv.items():
        for k, c in cells.items():
            s = 1000.0 if k == "idm" else 1.0
            lines.append(
                f"| {name} | {_LABELS[k]} | {s * c['estimate']:.3f} | {_ci(c['users'], s)} | "
                f"{_ci(c['repeats'], s)} |"
            )
    paired = (results.get("paired") or {}).get("minus_single") or {}
    for name, cells in paired.items():
        lines += [
            "",
            f"{name} minus single, paired on the same users and runs "
            f"({results['paired']['draws']} user resamples):",
            "",
            "| metric | difference | users 95 % CI | runs 95 % CI | verdict (users) |",
            "|---|---|---|---|---|",
        ]
        for k, c in cells.items():
            s = 1000.0 if k == "idm" else 1.0
            lines.append(
                f"| {_LABELS[k]} | {s * c['estimate']:+.3f} | {_ci(c['users'], s)} | "
                f"{_ci(c['repeats'], s)} | {verdict(c)} |"
            )
    return lines
