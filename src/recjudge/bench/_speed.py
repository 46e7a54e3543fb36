"""The performance benchmarks as typed configs: throughput, latency, estimator-speed,
gpu-check, decoding and cf, registered in ``BENCHMARKS`` beside the paper experiments.

Each config holds every setting of its benchmark (what ``results.json`` stores under
``config``, so ``recjudge bench run NAME --config results.json`` reruns it); ``recjudge bench
NAME`` builds its options from the config's fields. ``run_*`` call the benchmark functions,
which keep their keyword signatures for library use; ``*_text`` are the lines the command
prints.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from recjudge._util import atomic_write_json, comma_list, json_loads
from recjudge.bench._cf import bench_cf
from recjudge.bench._decoding import bench_decoding
from recjudge.bench._estimator_speed import bench_estimator_speed
from recjudge.bench._gpu_check import gpu_check, qwen_tokenizer
from recjudge.bench._latency import bench_latency
from recjudge.bench._throughput import bench_throughput
from recjudge.llm import LLMConfig, require_device

__all__ = [
    "CfBenchConfig",
    "DecodingBenchConfig",
    "EstimatorSpeedConfig",
    "GpuCheckConfig",
    "LatencyConfig",
    "ThroughputConfig",
]


class _Bench(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def _recorded(c: BaseModel, out: str | Path, r: dict[str, Any]) -> dict[str, Any]:
    """``r`` with the config, also written into ``out/results.json`` (so ``bench run NAME
    --config OUT/results.json`` reruns the benchmark)."""

    r = {**r, "config": c.model_dump(mode="json")}
    path = Path(out) / "results.json"
    if path.exists():
        saved = json_loads(path.read_text())
        if isinstance(saved, dict):
            atomic_write_json(path, {**saved, "config": r["config"]})
    return r


class ThroughputConfig(_Bench):
    """``bench throughput``: every method on the same mixed-verdict BRIEF workload."""

    model: str = Field("qwen2.5-coder-0.5b", description="Judge LLM (preset, path or id).")
    users: int = Field(3, ge=1, description="ML-1M users in the workload.")
    candidates: int = Field(20, ge=1, description="Candidates judged per user.")
    history: int = Field(50, ge=1, description="History items per prompt.")
    threads: int = Field(2, ge=1, description="Torch threads.")
    seed: int = Field(0, description="Users' and sigmas' seed.")
    beta: float = Field(25.0, description="BRIEF beta of the workload.")
    max_new_tokens: int = Field(256, ge=1, description="Answer length cap.")
    dtype: str = Field("auto", description="auto | bfloat16 | float32 (every method alike).")
    methods: tuple[str, ...] | None = Field(
        None, description="Comma-separated subset (the naive references always run)."
    )
    vllm_python: str = Field(
        ".venv-vllm/bin/python",
        description="The vLLM environment's interpreter (make setup-vllm); vLLM rows are "
        "skipped when it does not exist.",
    )
    workloads: tuple[str, ...] = Field(
        ("evidence-heavy", "decision-heavy"),
        description="evidence-heavy (beta 0: most answers cite evidence) and/or "
        "decision-heavy (BRIEF at --beta with ALS's sigma: most answers are NO).",
    )
    plain_vllm: bool = Field(True, description="Also time plain vLLM (no recjudge processor).")
    together: bool = Field(
        True,
        description="Every method gets the whole workload in one call (several users' "
        "candidates decoded together; vLLM always does); --no-together: ours per user.",
    )

    @field_validator("methods", mode="before")
    @classmethod
    def _methods(cls, v: Any) -> Any:
        return comma_list(v) or None


def _throughput_out(c: ThroughputConfig) -> str:
    resolved = LLMConfig(model=c.model, dtype=c.dtype).resolved_dtype()
    suffix = "" if resolved == "bfloat16" else "-fp32" if resolved == "float32" else f"-{resolved}"
    return f"reports/throughput/{c.model}{suffix}"


def run_throughput(c: ThroughputConfig, out: str | Path) -> dict[str, Any]:
    return _recorded(c, out, bench_throughput(c, out))


def throughput_text(r: dict[str, Any]) -> str:
    lines = []
    for w, wl in r["workloads"].items():
        lines.append(f"{w}: {100 * wl['yes_rate']:.0f} % YES, {wl['mean_evidence']:.2f} "
                     "evidence titles per answer")  # fmt: skip
        for name, m in wl["methods"].items():
            agree = m["agreement_with_naive"]
            shown = "n/a" if agree is None else f"{100 * agree:.1f} %"
            lines.append(f"  {name:<22} {m['kind']:<8} {m['pairs_per_s']:.3f} pairs/s  "
                         f"agreement {shown}  YES {100 * m['yes_rate']:.0f} %  "
                         f"peak {m['peak_rss_mb']:.0f} MB")  # fmt: skip
        lines += [f"  {k}: {v:.2f}x" for k, v in wl["ratios"].items()]
    return "\n".join(lines)


class LatencyConfig(_Bench):
    """``bench latency``: a cold CLI judgment and warm judgments with evidence."""

    model: str = Field("smollm2-135m", description="Judge LLM (preset, path or id).")
    users: int = Field(6, ge=1, description="Warm users timed.")
    history: int = Field(50, ge=1, description="History items per prompt.")
    repeats: int = Field(3, ge=1, description="Cold starts timed (median).")
    seed: int = Field(0, description="Users' seed.")


def run_latency(c: LatencyConfig, out: str | Path) -> dict[str, Any]:
    return _recorded(c, out, bench_latency(**c.model_dump(), out=out))


def latency_text(r: dict[str, Any]) -> str:
    c, w = r["cold"], r["warm"]
    # Results written before the start was split further have only these two parts.
    names = {"import_s": "import", "torch_import_s": "torch", "data_load_s": "data",
             "transformers_import_s": "transformers", "model_load_s": "tokenizer + weights",
             "start_exit_s": "start and exit", "judgment_s": "judgment"}  # fmt: skip
    parts = ", ".join(f"{n} {c[k]:.2f} s" for k, n in names.items() if k in c)
    if c.get("over_floor") is not None:  # results before the floor was measured have none
        parts += f"; {c['over_floor']:.2f}x its floor of {c['floor_s']:.2f} s"
    t = r.get("cold_transformers")  # results before the native forward have no such run
    versus = "" if t is None else (
        f"; on transformers' model {t['cli_judgment_s']:.2f} s "
        f"({c['cli_judgment_s'] / t['cli_judgment_s']:.2f}x)"
    )  # fmt: skip
    return (
        f"cold CLI judgment {c['cli_judgment_s']:.2f} s ({parts}){versus}; warm new user "
        f"{w['new_user_judgment_s']:.2f} s, same user {w['same_user_judgment_s']:.2f} s"
    )


class EstimatorSpeedConfig(_Bench):
    """``bench estimator-speed``: ``evaluate`` with and without every estimator."""

    users: int = Field(6040, ge=1, description="Synthetic users (ML-1M's count).")
    runs: int = Field(5, ge=1, description="Systems compared.")
    k: int = Field(20, ge=1, description="List length.")
    repeats: int = Field(3, ge=1, description="Timed runs per setting (median).")


def run_estimator_speed(c: EstimatorSpeedConfig, out: str | Path) -> dict[str, Any]:
    return _recorded(c, out, bench_estimator_speed(**c.model_dump(), out=out))


class GpuCheckConfig(_Bench):
    """``bench gpu-check``: engine against ``generate()`` on Qwen2.5-1.5B's architecture with
    random weights (parity and judgments/s; no weights or network needed)."""

    tokenizer: str | None = Field(
        None, description="Qwen2.5 tokenizer folder (default: the preset's cache)."
    )
    device: str = Field("auto", description="auto | cpu | cuda | cuda:N")
    dtype: str = Field("auto", description="auto (bf16 on a GPU) | bfloat16 | float32")
    users: int = Field(10, ge=1, description="Users timed.")
    candidates: int = Field(20, ge=1, description="Candidates per user.")
    history: int = Field(50, ge=1, description="History titles per prompt.")
    naive_users: int = Field(1, ge=1, description="Users timed with generate() alone.")
    parity_requests: int = Field(4, ge=1, description="Requests checked verdict for verdict.")
    max_new_tokens: int = Field(160, ge=1, description="Answer length cap.")
    layers: int | None = Field(None, ge=1, description="Fewer layers: a quick look.")
    seed: int = Field(0, description="Prompts' and weights' seed.")


def run_gpu_check(c: GpuCheckConfig, out: str | Path) -> dict[str, Any]:
    # a device torch cannot use is said before the Qwen tokenizer's preset is fetched and
    # built (a machine without it would otherwise first be told to install that model)
    require_device(LLMConfig(model="random", device=c.device).resolved_device())
    args = c.model_dump()
    args["tokenizer"] = c.tokenizer or qwen_tokenizer()
    return _recorded(c, out, gpu_check(**args, out=out))


class DecodingBenchConfig(_Bench):
    """``bench decoding``: grammar compile time and the per-token mask + bias overhead."""

    model: str = Field("qwen2.5-coder-0.5b", description="Model whose tokenizer is compiled.")
    titles: int = Field(200, ge=1, description="History titles in the grammar.")
    batch: int = Field(4, ge=1, description="Rows per decode step.")
    steps: int = Field(40, ge=1, description="Decode steps timed.")
    repeats: int = Field(5, ge=1, description="Compiles timed (median).")
    seed: int = Field(0, description="Titles' seed.")


def run_decoding(c: DecodingBenchConfig, out: str | Path) -> dict[str, Any]:
    args = c.model_dump()
    return _recorded(c, out, bench_decoding(n_titles=args.pop("titles"), **args, out=out))


def decoding_text(r: dict[str, Any]) -> str:
    return (
        f"compile {r['compile_ms']['median']:.1f} ms; overhead "
        f"{100 * r['overhead_fraction']:.2f} % of a decode step"
    )


class CfBenchConfig(_Bench):
    """``bench cf``: SASRec against the paper, the other models on the same protocols."""

    sasrec: str = Field(description="A SASRec folder from `cf train`.")
    saved: tuple[str, ...] = Field(
        (), description="More saved models as NAME=DIR,... (e.g. fm=runs/fm,nrms=runs/nrms)."
    )
    train: tuple[str, ...] = Field(
        ("als", "bpr", "itemknn", "pop"), description="Models trained here, default configs."
    )
    data: str = Field("ml-1m", description="Dataset.")
    seed: int = Field(0, description="Training seed.")
    threads: int = Field(2, ge=1, description="Torch threads.")

    @field_validator("saved", "train", mode="before")
    @classmethod
    def _lists(cls, v: Any) -> Any:
        return comma_list(v)

    @field_validator("saved")
    @classmethod
    def _pairs(cls, saved: tuple[str, ...]) -> tuple[str, ...]:
        for p in saved:
            name, eq, folder = p.partition("=")
            if not (eq and name.strip() and folder.strip()):
                raise ValueError(f"{p!r} is not NAME=DIR; write e.g. --saved fm=runs/fm")
        return saved


def run_cf(c: CfBenchConfig, out: str | Path) -> dict[str, Any]:
    saved = {n.strip(): d.strip() for n, _, d in (p.partition("=") for p in c.saved)}
    r = bench_cf(c.sasrec, c.data, c.seed, c.threads, out, saved=saved, train=c.train)
    return _recorded(c, out, r)


def cf_text(r: dict[str, Any]) -> str:
    lines = [
        f"{name:<14} HR@10 {m['sampled_hr@10']:.4f}  NDCG@10 {m['sampled_ndcg@10']:.4f}"
        f"  full Recall@10 {m['full_recall@10']:.4f}"
        for name, m in r["models"].items()
    ]
    return "\n".join([*lines, f"SASRec gap to paper: {r['gap_to_paper']}"])


def json_text(r: dict[str, Any]) -> str:
    return json.dumps(r, indent=2, ensure_ascii=False, default=str)


#: name -> (config, run, text, default out, one line for ``bench list``)
SPEED = {
    "throughput": (ThroughputConfig, run_throughput, throughput_text, _throughput_out,
                   "naive generate(), the engines, sweeps, llama.cpp, vLLM, like for like"),
    "latency": (LatencyConfig, run_latency, latency_text,
                lambda c: f"reports/latency/{c.model}",
                "cold CLI judgment (fresh process) and warm judgments with evidence"),
    "estimator-speed": (EstimatorSpeedConfig, run_estimator_speed,
                        lambda r: json_text(r["median_seconds"]),
                        lambda c: "reports/estimator-speed",
                        "wall time of evaluate with and without every estimator"),
    "gpu-check": (GpuCheckConfig, run_gpu_check, json_text, lambda c: "reports/gpu-check",
                  "engine vs generate() on Qwen2.5-1.5B's architecture, random weights"),
    "decoding": (DecodingBenchConfig, run_decoding, decoding_text,
                 lambda c: "reports/decoding",
                 "grammar compile time and per-token mask + bias overhead"),
    "cf": (CfBenchConfig, run_cf, cf_text, lambda c: "reports/cf",
           "SASRec vs the paper, the other models on the same protocols"),
}  # fmt: skip
