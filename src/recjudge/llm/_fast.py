"""The fast decoding engine: shared prefix KV caches, read in place by every row.

Every candidate judged against one user shares the user's prompt prefix (system text,
history, instructions). The prefix is prefilled once at its exact length and its keys and
values are kept once per layer (``PrefixKV``). Each row (a candidate's suffix and its
generated tokens) has a small buffer of its own, with room for the first ``FIRST_ROOM``
tokens, doubled when an answer runs longer, so nothing is copied per row and nothing grows
by concatenation per step. A custom attention function
(registered with transformers' ``AttentionInterface``, or the native forward's registry,
``recjudge.llm._native``) computes every layer's attention in
two blocks merged by one softmax:

    s_prefix = q K_prefix^T * scale                    (one matmul for all rows of a KV head)
    s_row    = q K_row^T * scale + mask_row            (causal within the row, pads masked)
    out      = softmax([s_prefix, s_row]) [V_prefix; V_row]

Rows of several prefixes (several users' candidates) decode together in one step: the rows
are ordered by prefix, every layer's projections and MLP run once for all of them, and the
prefix block above is computed per prefix on its contiguous rows (``_Rows.spans``); each
row's positions start after its own prefix.

Grammar drafts: a row whose grammar forces its next text (the rest of a title once its first
tokens single it out, a closing quote) is fed its chosen token and that text's tokens in one
forward, and keeps those the model itself chooses, read in order as the steps they replace
(speculative decoding with the grammar as the drafter, ``_loop``); the steps of a row then
take a variable number of tokens each (``_packed_step``).

Rows run at the batch size that is active (no padding rows, finished rows leave), in the
model's dtype for the projections. On the CPU each prefix block is computed by torch's flash
kernel in the model's dtype (as the naive reference's sdpa) and merged with the rows' own
block (fp32) by log-sum-exps (``_merged_decode``, ``_packed_prefill``); elsewhere attention
runs in fp32 as written above. A row's result equals a one-row run
up to floating-point rounding (matrix kernels choose their blocking by row count); the
batch-invariant engine (``recjudge.llm._engine``, ``deterministic=True`` on the judge) is
bit-exact whatever the batch, at several times the cost.

Supported: native models, and decoder-only transformers models whose attention follows its
functional ``AttentionInterface`` with full causal attention (Llama, Qwen2/2.5/3, Mistral without a
sliding window, ...). ``supports_fast`` says whether a loaded model qualifies.

This module chooses the engine (``decode_shared``, ``decode_prompts``); the fast engine's
parts live beside it: its prefix caches (``recjudge.llm._prefix_cache``), its attention
kernels and row buffers (``recjudge.llm._fast_attention``) and its decode loop
(``recjudge.llm._fast_loop``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from recjudge.llm._engine import constrained_decode, prefix_cache, shared_prefix_decode
from recjudge.llm._fast_attention import ATTN_NAME, fast_attention
from recjudge.llm._fast_loop import (
    extend_prefix,
    fast_decode,
    fast_shared_prefix_decode,
    prefill_rows,
)
from recjudge.llm._job import EngineJob, by_rows, chunks
from recjudge.llm._prefix_cache import PrefixKV, PrefixLRU, encode_prefix, prefixes_of

_FAST_TYPES = {"llama", "qwen2", "qwen3", "mistral", "granite", "olmo2", "smollm3"}


def supports_fast(model: Any) -> bool:
    """Whether ``model`` can run on this engine (full causal attention, functional API)."""
    cfg = model.config
    if cfg.model_type not in _FAST_TYPES:
        return False
    if getattr(cfg, "use_sliding_window", False) and getattr(cfg, "sliding_window", None):
        return False
    types = getattr(cfg, "layer_types", None) or ["full_attention"]
    return all(t == "full_attention" for t in types)


def decode_shared(
    backend: Any,
    prefixes: Sequence[Sequence[int]],
    prefix_of: Sequence[int],
    suffix_ids: Sequence[Sequence[int]],
    job: EngineJob,
) -> list[list[int]]:
    """Decode suffixes, row ``i`` after ``prefixes[prefix_of[i]]``, on the fast engine (rows
    of every prefix together, each prefix encoded once), or prefix by prefix on the
    batch-invariant engine with ``job.deterministic`` (or for a model the fast engine does
    not support).

    ``job.rows``: rows per decode batch (with ``deterministic``, the fixed row count that
    makes results batch-invariant; else only a memory bound). ``job.allowed(rows)``: the
    token ids any of the rows may take next (sorted int64, or None for any), known before
    the step: the fast engine then computes the LM head only for them (see ``_Head``), the
    rest come as ``-inf``, and ``job.step`` is called as ``step(scores, rows, columns)`` with
    the ids computed, so it can read and mask those columns only (it must still mask them).
    ``job.draft(row)``: token ids the row will probably take next (the grammar's forced
    text): the fast engine feeds them with the row's token and keeps those the model chooses
    (``_loop``); the invariant engine ignores them.
    """
    n = len(suffix_ids)
    if len(prefix_of) != n or any(not 0 <= g < len(prefixes) for g in prefix_of):
        raise ValueError(f"prefix_of must give each of {n} rows one of {len(prefixes)} prefixes")
    lru = prefixes_of(backend)
    invariant = job.deterministic or not supports_fast(backend.model)
    lru.reserve("invariant" if invariant else "fast", prefixes)
    if not invariant:
        kvs = [lru.get("fast", p, lambda p=p: encode_prefix(backend, p), job.stats)
               for p in prefixes]  # fmt: skip
        return fast_decode(backend, kvs, prefix_of, suffix_ids, job)

    def one_prefix(rows: list[int]) -> list[list[int]]:  # one prefix cache at a time
        ids = prefixes[prefix_of[rows[0]]]
        cache = lru.get("invariant", ids, lambda: prefix_cache(backend, ids), job.stats)
        return shared_prefix_decode(backend, ids, [suffix_ids[i] for i in rows],
                                    job.subset(rows), cache=cache)  # fmt: skip

    parts = [[i for i in range(n) if prefix_of[i] == g] for g in range(len(prefixes))]
    return by_rows(n, [rows for rows in parts if rows], one_prefix)


def decode_prompts(
    backend: Any, prompt_ids: Sequence[Sequence[int]], job: EngineJob
) -> list[list[int]]:
    """Decode independent prompts. On the fast engine, each batch of ``job.rows`` prompts
    shares its longest common token prefix (chat templates and instructions usually give
    one) and only the rest is prefilled per row (``job.allowed`` is for shared prefixes and
    not used here)."""
    if job.deterministic or not supports_fast(backend.model):
        return constrained_decode(backend, prompt_ids, job)

    def one_batch(rows: list[int]) -> list[list[int]]:
        chunk = [list(prompt_ids[r]) for r in rows]
        common = _common_prefix(chunk)
        if len(chunk) > 1 and common < MIN_SHARED:  # not worth a prefix of its own
            common = 0
        kv = encode_prefix(backend, chunk[0][:common]) if common else None
        if job.stats is not None:
            job.stats.prefill_tokens += common
        return fast_shared_prefix_decode(backend, kv, [p[common:] for p in chunk],
                                         replace(job.subset(rows), allowed=None))  # fmt: skip

    n = len(prompt_ids)
    return by_rows(n, chunks([range(n)], job.rows), one_batch)


MIN_SHARED = 16  # tokens


def _common_prefix(prompts: list[list[int]]) -> int:
    """Length of the longest common prefix, leaving every prompt at least one own token."""
    limit = min(len(p) for p in prompts) - 1
    first = prompts[0]
    n = 0
    while n < limit and all(p[n] == first[n] for p in prompts):
        n += 1
    return n


__all__ = [
    "ATTN_NAME",
    "PrefixKV",
    "PrefixLRU",
    "decode_prompts",
    "decode_shared",
    "encode_prefix",
    "extend_prefix",
    "fast_attention",
    "fast_decode",
    "fast_shared_prefix_decode",
    "prefill_rows",
    "prefixes_of",
    "supports_fast",
]
