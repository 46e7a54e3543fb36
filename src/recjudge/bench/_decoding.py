"""Decoding benchmark: grammar compile time and per-token mask + bias overhead."""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from recjudge._util import chat
from recjudge.data import load_dataset, sample_users
from recjudge.decoding import (
    BranchBiasProcessor,
    EvidenceFirst,
    GrammarCache,
    GrammarLogitsProcessor,
)
from recjudge.llm import LLMConfig, load_llm
from recjudge.reporting import write_report

if TYPE_CHECKING:
    from recjudge.llm import LLMBackend

JUDGE_SYSTEM = (
    "Judge if the user would enjoy the candidate. List evidence titles from the "
    "history if and only if it is relevant. Answer in JSON."
)


def bench_decoding(
    model: str = "qwen2.5-coder-0.5b",
    n_titles: int = 200,
    batch: int = 4,
    steps: int = 40,
    repeats: int = 5,
    out: str | Path = "reports/decoding",
    seed: int = 0,
) -> dict[str, Any]:
    """Measure compile time for ``n_titles`` titles and the per-token processor overhead.

    The overhead is measured inside one real greedy decode loop: each step times the model
    forward (batch ``batch``, KV cache) and, separately, the grammar mask plus branch bias on
    the same logits, so both numbers come from the same run and the same machine state.
    """
    import torch

    ds = load_dataset("ml-1m")
    # the processors' per-step cost on the model's own steps: in process whatever the
    # command line's --backend
    llm = load_llm(LLMConfig(model=model, backend="transformers"))
    compile_ms, users = _compile_times(ds, llm, n_titles, repeats, seed)
    titles = ds.history(users[0]).item_id.tolist()[-n_titles:]
    model_ms, proc_ms, generated = _decode_loop(llm, ds, titles, batch, steps)
    # The first step is the prefill; per-token overhead compares decode steps.
    decode_model = model_ms[1:]
    decode_proc = proc_ms[1:]
    ratio = statistics.median(decode_proc) / statistics.median(decode_model)
    results = {
        "model": model,
        "n_titles": n_titles,
        "batch": batch,
        "threads": torch.get_num_threads(),
        "compile_ms": {"median": statistics.median(compile_ms), "all": compile_ms},
        "prefill_ms": model_ms[0],
        "decode_step_ms_median": statistics.median(decode_model),
        "processor_ms_median": statistics.median(decode_proc),
        "processor_ms_p90": sorted(decode_proc)[int(0.9 * (len(decode_proc) - 1))],
        "overhead_fraction": ratio,
        "target_fraction": 0.05,
        "meets_target": ratio < 0.05,
        "steps_measured": len(decode_proc),
        "generated": generated,
    }
    lines = [
        f"# Decoding overhead ({model})",
        "",
        f"- grammar compile, {n_titles} titles: median {results['compile_ms']['median']:.1f} ms "
        f"over {len(compile_ms)} users",
        f"- decode step (batch {batch}): median {results['decode_step_ms_median']:.1f} ms",
        f"- grammar mask + branch bias per step: median {results['processor_ms_median']:.2f} ms"
        f" (p90 {results['processor_ms_p90']:.2f} ms)",
        f"- overhead: **{100 * ratio:.2f} %** of a decode step (target < 5 %)",
        f"- torch threads: {results['threads']}",
    ]
    write_report(out, results, lines)
    return results


def _compile_times(
    ds: Any, llm: LLMBackend, n_titles: int, repeats: int, seed: int
) -> tuple[list[float], list[str]]:
    """Grammar compile time (ms) of ``n_titles`` titles of different users, each with a
    fresh cache; and those users."""
    tok = llm.tokenizer
    compile_ms = []
    users = [u for u in sample_users(ds.user_ids(), 50, seed) if len(ds.history(u)) >= n_titles]
    users = users[:repeats] or sample_users(ds.user_ids(), repeats, seed)
    for u in users:
        titles = ds.history(u).item_id.tolist()[-n_titles:]
        cache = GrammarCache()
        cache.table(tok, llm.vocab_size)  # tokenizer info is per tokenizer, not per grammar
        t0 = time.perf_counter()
        cache.compile(EvidenceFirst(titles), tok, llm.vocab_size)
        compile_ms.append((time.perf_counter() - t0) * 1000)
    return compile_ms, users


def _decode_loop(
    llm: LLMBackend, ds: Any, titles: list[str], batch: int, steps: int
) -> tuple[list[float], list[float], list[str]]:
    """Per step of a real greedy decode (KV cache): the model forward's ms and the grammar
    mask + branch bias's ms on the same logits (second of two passes; the first warms up),
    and the generated answers."""
    import torch

    compiled = GrammarCache().compile(EvidenceFirst(titles), llm.tokenizer, llm.vocab_size)
    hist = "\n".join(f"- {t}" for t in titles[-50:])
    prompts = [
        llm.chat_prompt(chat(JUDGE_SYSTEM, f"History:\n{hist}\n\nCandidate: {c}"))
        for c in ds.items.title.tolist()[:batch]
    ]
    enc = llm.tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    model_ms: list[float] = []
    proc_ms: list[float] = []
    for rep in range(2):  # first pass warms up
        grammar = GrammarLogitsProcessor([compiled] * batch)
        bias = BranchBiasProcessor(
            [compiled.decision()] * batch, compiled.table.token_bytes, [0.5] * batch, beta=25.0
        )
        ids, mask = enc["input_ids"], enc["attention_mask"]
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        past, step_in = None, ids
        with torch.inference_mode():
            for _ in range(steps):
                t0 = time.perf_counter()
                fwd = llm.model(
                    input_ids=step_in,
                    attention_mask=mask,
                    position_ids=pos,
                    past_key_values=past,
                    use_cache=True,
                    logits_to_keep=1,
                )
                scores = fwd.logits[:, -1, :].float()
                t1 = time.perf_counter()
                grammar(ids, scores)
                bias(ids, scores)
                nxt = scores.argmax(-1, keepdim=True)
                t2 = time.perf_counter()
                if rep:
                    model_ms.append((t1 - t0) * 1000)
                    proc_ms.append((t2 - t1) * 1000)
                past = fwd.past_key_values
                ids = torch.cat([ids, nxt], 1)
                mask = torch.cat([mask, torch.ones_like(nxt)], 1)
                pos = pos[:, -1:] + 1
                step_in = nxt
                if all(grammar.done(r) for r in range(batch)):
                    break
    return model_ms, proc_ms, [grammar.text(r) for r in range(batch)]
