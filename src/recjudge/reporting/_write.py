"""Report writing shared by evaluators and benchmarks: results.json + report.md (+ PNGs)."""

from __future__ import annotations

import platform
import time
from pathlib import Path
from typing import Any

from recjudge._util import atomic_write_json, atomic_write_text, native_bf16
from recjudge.reporting._html import write_html
from recjudge.reporting._mlflow import log_report, tracking_uri


def environment() -> dict[str, Any]:
    import torch
    import transformers

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cpu_count": __import__("os").cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "machine": platform.machine(),
        "cpu": _cpu_model(),
        # dtype="auto" computes in bf16 only where the CPU has it natively (2-3x faster
        # there, 2-3x slower elsewhere): figures from the two kinds are not comparable.
        "native_bf16": native_bf16(),
        # The GPU torch sees (None: none), so a report says what computed it.
        "gpu": _gpu(torch),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def _gpu(torch: Any) -> str | None:
    try:
        if not torch.cuda.is_available():
            return None
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except (RuntimeError, AssertionError):  # a driver torch cannot talk to
        return None
    return ", ".join(names) if len(set(names)) > 1 else f"{len(names)} x {names[0]}"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def write_report(out: str | Path, results: dict[str, Any], lines: list[str]) -> Path:
    """Write ``results.json`` (with the environment), ``report.md`` and ``report.html`` (the
    same report, self-contained, its PNGs inline: ``reporting._html``) under ``out``. Write
    the figures first: the page embeds the PNG files the markdown names."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    results = {**results, "environment": environment()}
    atomic_write_json(out / "results.json", results)
    env = results["environment"]
    footer = [
        "",
        f"_torch {env['torch']}, transformers {env['transformers']}, "
        f"{env['cpu_count']} CPUs ({env['cpu']}, native bf16: {env['native_bf16']}), "
        f"{env['torch_threads']} threads, GPU: {env.get('gpu') or 'none'}, {env['date']}_",
    ]
    atomic_write_text(out / "report.md", "\n".join(lines + footer) + "\n")
    write_html(out, results, lines + footer)
    if tracking_uri():  # --mlflow / $RECJUDGE_MLFLOW_URI
        title = next((ln.lstrip("# ").strip() for ln in lines if ln.startswith("#")), out.name)
        log_report(out, results, title)
    return out
