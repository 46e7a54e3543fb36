"""The fast engine with and without packed linear weights (``recjudge.llm._native.Linear``),
in one process on the same requests: ``bench throughput``'s user 0 (ML-1M, 20 candidates,
50-item history) on the 0.5B, read-outs and full answers of the evidence-heavy workload
(beta 0) and read-outs of the decision-heavy one (BRIEF at beta 25, ALS sigma). Each variant
judges another user's requests untimed first; the rounds alternate which variant goes first.
Prints and writes (``--out``) each variant's seconds per round, their medians and ratio, and
whether verdicts, evidence and p_yes agree. ``--dtype float32`` for the fp32 path; with
``ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 ATEN_CPU_CAPABILITY=avx2`` in the
environment the libraries keep to AVX2, as on an AVX2-only CPU.

    .venv/bin/python scripts/packed_weights_ab.py --out reports/throughput/DIR/packed-ab.json

Last run: reports/throughput/README.md (issue 93, packed weights).
"""

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

from recjudge.bench._throughput import _requests
from recjudge.cf_models import cached_cf
from recjudge.data import load_dataset
from recjudge.llm import LLMConfig, load_llm
from recjudge.llm._native import packed_weights
from recjudge.reporting import environment
from recjudge.reward import Judge, JudgeConfig, clear_prefix_cache

MODEL = "qwen2.5-coder-0.5b"
ISA_VARIABLES = ("ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "ATEN_CPU_CAPABILITY")
#: (name, beta, full answers)
WORKLOADS = (
    ("evidence-heavy read-outs", 0.0, False),
    ("evidence-heavy full answers", 0.0, True),
    ("decision-heavy read-outs", 25.0, False),
)


def _one(judge: Judge, group: list, warmup: list, rounds: int) -> dict:
    for on in (False, True):
        with packed_weights(on):
            clear_prefix_cache(judge.llm)
            judge.judge_many(warmup[:2])
    seconds: dict[bool, list[float]] = {False: [], True: []}
    answers: dict[bool, list] = {}
    for k in range(rounds):
        for on in (False, True) if k % 2 == 0 else (True, False):
            with packed_weights(on):
                clear_prefix_cache(judge.llm)  # each variant prefills the user's prefix
                t0 = time.perf_counter()
                got = judge.judge_many(group)
                seconds[on].append(time.perf_counter() - t0)
            answers[on] = [(j.is_relevant, tuple(j.evidence), j.p_yes) for j in got]
    off, on = statistics.median(seconds[False]), statistics.median(seconds[True])
    pairs = list(zip(answers[False], answers[True], strict=True))
    return {
        "seconds_unpacked": seconds[False], "seconds_packed": seconds[True],
        "median_unpacked": off, "median_packed": on, "speedup": off / on,
        "same_verdicts": all(a[0] == b[0] for a, b in pairs),
        "same_evidence": all(a[1] == b[1] for a, b in pairs),
        "max_abs_p_yes_difference": max(abs(a[2] - b[2]) for a, b in pairs),
    }  # fmt: skip


def main(rounds: int, out: Path | None, dtype: str) -> None:
    torch.set_num_threads(2)
    ds = load_dataset("ml-1m")
    cf, _, _ = cached_cf("als", ds, {"factors": 64, "iterations": 15}, seed=0)
    llm = load_llm(LLMConfig(model=MODEL, backend="transformers", dtype=dtype))
    group, warmup = _requests(ds, 2, 20, 50, 0)
    isa = {k: os.environ.get(k) for k in ISA_VARIABLES}
    res = {"model": MODEL, "dtype": str(llm.model.dtype), "rounds": rounds, "isa_limits": isa,
           "environment": environment(), "workloads": {}}  # fmt: skip
    for name, beta, full in WORKLOADS:
        cfg = JudgeConfig(model=MODEL, mode="brief", beta=beta, max_history=50,
                          token_budget=100_000, need_evidence=full)  # fmt: skip
        r = _one(Judge(cfg, llm=llm, cf=cf), group, warmup, rounds)
        res["workloads"][name] = r
        print(f"{name}: {r['median_unpacked']:.3f} s -> {r['median_packed']:.3f} s "
              f"({r['speedup']:.3f}x); same verdicts {r['same_verdicts']}, evidence "
              f"{r['same_evidence']}, max |dp_yes| {r['max_abs_p_yes_difference']:.3g}",
              flush=True)  # fmt: skip
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=6, help="timed rounds per variant")
    ap.add_argument("--out", type=Path, default=None, help="JSON to write")
    ap.add_argument("--dtype", default="auto", help="auto (bf16 where native), float32, ...")
    a = ap.parse_args()
    main(a.rounds, a.out, a.dtype)
