"""Rows per decode step on long grammar-constrained answers: GISTBench's extraction questions
asked with each ``decode_rows`` setting, the same questions and budget on every side.

A decode step streams the weights once for all its rows, so more rows should cost little
more per step on a memory-bound CPU; but with a fixed row count a finished row keeps its slot
until the longest answer of its batch ends. Which effect wins on answers of very different
lengths is what this measures. Greedy decoding on the fast engine (what the evaluators use):
batches of another shape sum in another order, so an answer may change between settings;
the report counts the answers identical to the first setting's.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from recjudge._util import DistinctPositiveInts
from recjudge.bench._memory import PeakRSS
from recjudge.evaluators import GistConfig, gist_extraction_asks
from recjudge.llm import LLMConfig, SamplingConfig, load_llm
from recjudge.reporting import write_report
from recjudge.reward import ResultsStore, ask_stored

if TYPE_CHECKING:
    from recjudge.llm import LLMBackend


class DecodeRowsConfig(BaseModel):
    """Settings of the ``decode-rows`` benchmark.

    Attributes:
        model: the model answering (preset, path or Hugging Face id).
        data: dataset whose users' histories are the prompts.
        users: GISTBench users sampled (sha256 order, at least 20 interactions).
        max_history: most recent engagements per user (100 with ``chunk_size`` 100: one
            extraction question per user, the paper's chunk).
        chunk_size: engagements per extraction question (the paper: 100).
        extraction_tokens: answer budget (GISTBench's default).
        rows: the ``decode_rows`` settings compared; every setting asks in batches of the
            largest, so only the rows per step differ.
        repeats: passes over every setting (their order alternates between passes).
        threads: torch threads.
        dtype: ``auto`` (bf16 where the CPU has it natively), ``bfloat16`` or ``float32``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = "qwen2.5-coder-1.5b"
    data: str = "ml-1m"
    users: int = Field(8, ge=1)
    max_history: int = Field(100, ge=5)
    chunk_size: int = Field(100, ge=5)
    extraction_tokens: int = Field(1024, ge=16)
    rows: DistinctPositiveInts = (1, 8)
    repeats: int = Field(1, ge=1)
    threads: int = Field(2, ge=1)
    dtype: str = "auto"


def bench_decode_rows(
    config: DecodeRowsConfig,
    out: str | Path = "reports/decode-rows",
    llm: LLMBackend | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Answers per second and generated tokens per second of each ``rows`` setting on the
    same extraction questions, with the share of answers identical to the first setting's;
    writes report.md and results.json.

    Args:
        llm: an already loaded transformers backend (tests); default: load ``config.model``.
    """
    import torch

    torch.set_num_threads(config.threads)
    gist = GistConfig(
        models=(config.model,),
        judge=config.model,
        users=config.users,
        max_history=config.max_history,
        chunk_size=config.chunk_size,
        extraction_tokens=config.extraction_tokens,
    )
    asks = gist_extraction_asks(gist, config.data)
    if llm is None:
        # rows per decode step of the in-process engines
        llm = load_llm(LLMConfig(model=config.model, dtype=config.dtype, backend="transformers"))
    dtype = str(next(llm.model.parameters()).dtype).removeprefix("torch.")
    mem = PeakRSS()
    passes: dict[int, list[dict[str, Any]]] = {r: [] for r in config.rows}
    try:
        for rep in range(config.repeats):
            order = config.rows if rep % 2 == 0 else config.rows[::-1]
            for rows in order:
                with mem.phase(str(rows)):
                    passes[rows].append(_one_pass(llm, asks, rows, config, progress))
    finally:
        mem.close()
    settings = {
        str(r): _setting(ps, passes[config.rows[0]][0], llm, mem.peaks.get(str(r), 0))
        for r, ps in passes.items()
    }
    first = settings[str(config.rows[0])]
    ratios = {
        f"rows {r} vs {config.rows[0]}": s["answers_per_s"] / first["answers_per_s"]
        for r, s in settings.items()
        if r != str(config.rows[0])
    }
    results = {
        "config": config.model_dump(),
        "dtype": dtype,
        "questions": len(asks),
        "prompt_tokens": [len(llm.encode(llm.chat_prompt(a.messages))) for a in asks],
        "settings": settings,
        "ratios": ratios,
    }
    write_report(out, results, _report_lines(results))
    return results


def _one_pass(
    llm: LLMBackend, asks: list[Any], rows: int, config: DecodeRowsConfig, progress: bool
) -> dict[str, Any]:
    """Ask every question into a fresh store; the seconds and the stored answers."""
    with tempfile.TemporaryDirectory() as tmp:
        store = ResultsStore(Path(tmp) / "store.sqlite")
        try:
            t0 = time.perf_counter()
            done = ask_stored(
                llm,
                store,
                asks,
                sampling=SamplingConfig(max_new_tokens=config.extraction_tokens),
                batch_size=max(config.rows),
                decode_rows=rows,
                desc=f"rows {rows}",
                progress=progress,
            )
            seconds = time.perf_counter() - t0
        finally:
            store.close()
    return {"seconds": seconds, "answers": [done[a.key] for a in asks]}


def _setting(passes: list[dict], reference: dict, llm: LLMBackend, peak: int) -> dict[str, Any]:
    """One setting's medians over passes, and its answers' agreement with ``reference``."""
    answers = passes[0]["answers"]
    tokens = sum(len(llm.encode(a["text"])) for a in answers)
    seconds = statistics.median(p["seconds"] for p in passes)
    same = sum(a["text"] == b["text"] for a, b in zip(answers, reference["answers"], strict=True))
    return {
        "seconds": seconds,
        "seconds_each_pass": [p["seconds"] for p in passes],
        "answers_per_s": len(answers) / seconds,
        "generated_tokens": tokens,
        "tokens_per_s": tokens / seconds,
        "complete": sum(a["complete"] for a in answers),
        "identical_to_first": same,
        "peak_rss_mb": peak / 2**20,
    }


def _report_lines(res: dict[str, Any]) -> list[str]:
    c = res["config"]
    p = sorted(res["prompt_tokens"])
    n = res["questions"]
    lines = [
        f"# Rows per decode step on GISTBench extraction answers ({c['model']} {res['dtype']}, "
        f"{c['data']})",
        "",
        f"{n} extraction questions ({c['users']} users, the {c['max_history']} most recent "
        f"engagements in chunks of {c['chunk_size']}; prompts {p[0]}-{p[-1]} tokens), greedy, "
        f"answer budget {c['extraction_tokens']} tokens, batches of {max(c['rows'])}, "
        f"{c['threads']} threads, {c['repeats']} pass(es) per setting (median). The same "
        "questions on every side: only the rows decoded per step differ. A ratio between "
        "recjudge's own settings, not a comparison with other engines "
        "(`recjudge bench throughput` has those).",
        "",
        "| rows per step | seconds | answers/s | generated tokens | tokens/s | complete | "
        "identical to first | peak RSS MB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r, s in res["settings"].items():
        lines.append(
            f"| {r} | {s['seconds']:.1f} | {s['answers_per_s']:.4f} | {s['generated_tokens']} "
            f"| {s['tokens_per_s']:.2f} | {s['complete']}/{n} | {s['identical_to_first']}/{n} "
            f"| {s['peak_rss_mb']:.0f} |"
        )
    lines += ["", *(f"- {k}: **{v:.2f}x** answers per second" for k, v in res["ratios"].items())]
    return lines
