"""llama.cpp (llama-cpp-python) as a benchmark method: the preset's own GGUF file.

What a user without our engine would run on a CPU: llama.cpp's forward passes, its prompt
cache (a new prompt reuses the KV of the longest common prefix with the previous one, so a
user's candidates share the history), greedy sampling, and the grammar and the BRIEF bias as
llama-cpp-python ``logits_processor``s (the same recjudge processors as every other method:
llama.cpp's own GBNF cannot add the bias at the decision step). ``make setup-llamacpp``
builds it.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

import numpy as np

from recjudge.bench._methods import Answer, Runner, _answer, processors_for
from recjudge.llm import PRESETS, assemble_gguf


def _load(model: str, threads: int) -> Any:
    from llama_cpp import Llama

    gguf = assemble_gguf(PRESETS.get(model))
    return Llama(
        model_path=str(gguf),
        n_ctx=8192,
        n_threads=threads,
        # prompts too: llama-cpp-python's default for them is every core of the machine
        n_threads_batch=threads,
        n_batch=512,
        verbose=False,
    )


def _judge_one(lcpp: Any, judge: Any, r: Any, readout: bool, max_new_tokens: int) -> Answer:
    import torch

    prompt, schema, grammar, proc = processors_for(judge, r)
    width = grammar.width

    def constrain(ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        # Tokens are accepted in the loop below, so mask and bias without input_ids.
        s = torch.from_numpy(scores[None, :width].astype(np.float32))
        grammar.mask(s, [0])
        proc.apply(s, [0])
        res = np.full_like(scores, -np.inf)
        res[:width] = s[0].numpy()
        return res

    new: list[int] = []
    eos = lcpp.token_eos()
    for token in lcpp.generate(prompt, temp=0.0, reset=True, logits_processor=[constrain]):
        if token == eos:
            break
        new.append(token)
        if readout and proc.commits_with(0, token):
            break
        grammar.accept(0, token)
        proc.accept(0, token)
        if grammar.done(0) or len(new) >= max_new_tokens:
            break
    return _answer(schema, judge.llm.tokenizer.decode(new, skip_special_tokens=True), readout)


def _run(lcpp: Any, judge: Any, readout: bool, max_new_tokens: int) -> Callable:
    def run(reqs: list[Any]) -> list[Answer]:
        return [_judge_one(lcpp, judge, r, readout, max_new_tokens) for r in reqs]

    return run


def llamacpp_runners(
    model: str, full: Any, readout: Any, max_new_tokens: int, threads: int = 2
) -> dict[str, Runner]:
    """llama.cpp full-answer and read-out methods, or none when it is not installed or the
    model is not a preset with a GGUF file."""
    if importlib.util.find_spec("llama_cpp") is None or model not in PRESETS:
        return {}
    lcpp = _load(model, threads)
    what = "llama.cpp (llama-cpp-python, preset GGUF, prompt-cache reuse) + recjudge processors"
    binding = llamacpp_binding(lcpp)
    return {
        "llamacpp_full": Runner(
            "full", what, _run(lcpp, full, False, max_new_tokens), binding=binding
        ),
        "llamacpp_readout": Runner(
            "readout",
            what + ", stops at the decision",
            _run(lcpp, readout, True, max_new_tokens),
            binding=binding,
        ),
    }


#: GGUF ``general.file_type`` values (llama.cpp's ``llama_ftype``) of the weights it computes on
_FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1",
               10: "Q2_K", 11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S",
               15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K", 32: "BF16"}  # fmt: skip


def llamacpp_binding(lcpp: Any) -> dict[str, Any]:
    """How the loaded llama.cpp computes, read from it (not from what it was asked): its
    threads for a batch and for one token, and the weights' GGUF file type."""
    ftype = lcpp.metadata.get("general.file_type")
    weights = _FILE_TYPES.get(int(ftype), f"file type {ftype}") if ftype is not None else "?"
    params = lcpp.context_params
    return {"threads": int(params.n_threads), "batch_threads": int(params.n_threads_batch),
            "weights": weights}  # fmt: skip
