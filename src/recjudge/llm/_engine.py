"""A batch-invariant constrained decoding loop for the transformers backend.

HF's left-padded batches are not bit-identical to single runs in bf16 (the attention kernel
for a masked batch differs from the unmasked one). Here every row computes exactly what it
would alone:

- prefill: every prompt is prefilled alone (a batch of one), right-padded to its length rounded
  up to ``BUCKET`` tokens, with plain causal attention and no padding mask, so a real token
  never sees a pad (pads only follow it); only the hidden state at its last real position goes
  through the LM head. Alone, because matrix kernels pick their blocking (and so their
  reduction order) by the row count: on oneDNN/AMX a row prefilled beside three others
  differed from the same row alone by 0.19 in its bf16 logits and by 6e-6 in fp32. The
  padded width fixes the attention kernel's blocking, so only rows of one bucket share a
  decode loop; suffixes after a shared prefix likewise decode with the suffixes of their own
  ``SUFFIX_BUCKET`` width;
- decode: one token per step with eager attention and an explicit mask over the pad slots
  of the cache; masked keys get exactly zero weight. Matrix kernels choose their reduction
  order by the number of rows, so every decode step runs exactly ``DECODE_ROWS`` rows,
  padding with copies of active rows; finished rows leave (their slots are refilled).

Sampling uses one torch Generator per row, seeded per request, so sampled outputs are also
independent of batching.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from recjudge._util import RunFault
from recjudge.llm._config import SamplingConfig
from recjudge.llm._job import EngineJob, by_rows, chunks
from recjudge.llm._native import new_cache


@dataclass
class EngineStats:
    """What an engine computed: prompt tokens prefilled, decode forwards (``decode_steps``)
    and the tokens they were fed (``decode_tokens``), rows decoded; ``draft_tokens`` of the
    fed tokens were grammar-forced drafts (``recjudge.llm._fast``), ``draft_accepted`` of
    those the model's own choice (each saved a forward)."""

    prefill_tokens: int = 0
    decode_steps: int = 0
    decode_tokens: int = 0
    rows: int = 0
    draft_tokens: int = 0
    draft_accepted: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


@contextmanager
def _attention(model: Any, impl: str):
    old = model.config._attn_implementation
    if old == impl:
        yield
        return
    model.set_attn_implementation(impl)
    try:
        yield
    finally:
        model.set_attn_implementation(old)


class NonFiniteLogitsError(RunFault, RuntimeError):
    """The model produced NaN or infinite logits: its weights (or the cache they were loaded
    from) are damaged, or the computation overflowed. No verdict can be read from them."""


def check_finite(logits: torch.Tensor, model_name: str = "the model") -> None:
    """Raise ``NonFiniteLogitsError`` if any raw logit is NaN or infinite.

    Checked before the grammar mask, which writes ``-inf`` on purpose: a NaN there would
    otherwise pass as a probability and give a confident answer from garbage.
    """
    if not bool(torch.isfinite(logits).all()):
        bad = int((~torch.isfinite(logits)).sum())
        raise NonFiniteLogitsError(
            f"{model_name} produced {bad} NaN/inf logits of {logits.numel()}; its weights are "
            "damaged or overflowed. For a preset, `recjudge models verify NAME` names the "
            "damaged files and `recjudge models install NAME --force` rebuilds the cache; for "
            "your own folder, re-download the weights"
        )


def sample_next(
    scores: torch.Tensor, sampling: SamplingConfig, generators: Sequence[torch.Generator] | None
) -> torch.Tensor:
    """Greedy argmax, or temperature -> top-k -> top-p sampling with per-row generators."""
    if not sampling.do_sample:
        return scores.argmax(-1)
    out = []
    for r in range(scores.shape[0]):
        s = scores[r] / sampling.temperature
        if sampling.top_k and sampling.top_k < s.shape[0]:
            kth = torch.topk(s, sampling.top_k).values[-1]
            s = s.masked_fill(s < kth, float("-inf"))
        if sampling.top_p < 1.0:
            sorted_s, order = torch.sort(s, descending=True)
            cum = torch.softmax(sorted_s, -1).cumsum(-1)
            drop = cum - torch.softmax(sorted_s, -1) >= sampling.top_p  # keep the first over p
            s = s.scatter(0, order, sorted_s.masked_fill(drop, float("-inf")))
        probs = torch.softmax(s, -1)
        out.append(torch.multinomial(probs, 1, generator=generators[r]).squeeze(0))
    return torch.stack(out)


BUCKET = 64


def bucket_width(length: int, bucket: int = BUCKET) -> int:
    """The padded width a prompt of ``length`` tokens is always computed at."""
    return -(-length // bucket) * bucket


def prefill(
    backend: Any, prompt_ids: Sequence[Sequence[int]], bucket: int = BUCKET
) -> tuple[torch.Tensor, Any]:
    """Right-padded causal prefill: fp32 next-token logits ``[B, V]`` and the KV cache.

    All rows must fall in one bucket (see ``bucket_width``).
    """
    model = backend.model
    dev = model.device
    lens = torch.tensor([len(p) for p in prompt_ids], device=dev)
    if int(lens.min()) < 1:
        raise ValueError("empty prompt")
    widths = {bucket_width(int(n), bucket) for n in lens}
    if len(widths) != 1:
        raise ValueError(f"rows span several buckets {sorted(widths)}; split them first")
    width = widths.pop()
    pad = backend.tokenizer.pad_token_id
    rows_logits, rows_kv = [], []
    with torch.inference_mode(), _attention(model, "sdpa"):
        for p in prompt_ids:  # one row at a time: see the module docstring
            ids = torch.full((1, width), pad, dtype=torch.long, device=dev)
            ids[0, : len(p)] = torch.tensor(list(p), dtype=torch.long, device=dev)
            own = new_cache(model)
            hidden = model.base_model(
                input_ids=ids, past_key_values=own, use_cache=True
            ).last_hidden_state
            rows_logits.append(model.get_output_embeddings()(hidden[:, len(p) - 1]).float())
            rows_kv.append([(layer.keys, layer.values) for layer in own.layers])
    cache = new_cache(model)
    for i in range(len(rows_kv[0])):
        cache.update(
            torch.cat([kv[i][0] for kv in rows_kv]), torch.cat([kv[i][1] for kv in rows_kv]), i
        )
    return torch.cat(rows_logits), cache


def constrained_decode(
    backend: Any, prompt_ids: Sequence[Sequence[int]], job: EngineJob
) -> list[list[int]]:
    """Generate for each prompt until ``job.finished(row)`` or ``sampling.max_new_tokens``,
    ``job.rows`` rows per decode step (fixed, so results do not depend on batching).

    Args:
        backend: a ``TransformersBackend``.
        prompt_ids: token ids per row.
        job: the hooks and options (``EngineJob``).

    Returns:
        The generated token ids per row.
    """
    # one decode loop per bucket (and per ``job.rows`` rows) keeps every row's arithmetic
    # fixed
    parts = chunks(_by_width(prompt_ids, BUCKET), job.rows)
    return by_rows(len(prompt_ids), parts, lambda rows: _decode_group(
        backend, [prompt_ids[r] for r in rows], job.subset(rows)))  # fmt: skip


def _by_width(seqs: Sequence[Sequence[int]], bucket: int) -> list[list[int]]:
    """The rows of ``seqs`` grouped by their padded width (``bucket_width``), in order."""
    groups: dict[int, list[int]] = {}
    for r, seq in enumerate(seqs):
        groups.setdefault(bucket_width(len(seq), bucket), []).append(r)
    return list(groups.values())


def _decode_group(backend: Any, prompt_ids: Sequence[Sequence[int]], job: EngineJob):
    """Up to ``job.rows`` prompts of one bucket, in ``job.rows`` cache slots."""
    n = len(prompt_ids)
    lens = [len(p) for p in prompt_ids]
    width = bucket_width(max(lens))
    logits, cache = prefill(backend, prompt_ids)
    if job.stats is not None:
        job.stats.prefill_tokens += sum(lens)
        job.stats.rows += n
    dev = backend.model.device
    key_mask = torch.zeros(n, width, dtype=torch.long, device=dev)
    for r, length in enumerate(lens):
        key_mask[r, :length] = 1
    slots = torch.tensor(list(range(n)) + [0] * (job.rows - n), device=dev)
    cache.batch_select_indices(slots)
    return _loop(backend, logits[slots], cache, key_mask[slots], lens, job)


def _loop(backend, logits, cache, key_mask, base_pos, job: EngineJob):
    """Decode rows ``0..n-1`` held in ``job.rows`` cache slots (extra slots are copies).

    ``logits`` are the slots' next-token logits, ``key_mask`` marks real cache entries and
    ``base_pos[r]`` is the position of row r's first generated token.
    """
    model = backend.model
    dev = model.device
    n, slots, sampling = len(base_pos), job.rows, job.sampling
    gens = None
    if sampling.do_sample:
        gens = [torch.Generator(device=dev).manual_seed(job.seed(r) % (2**63)) for r in range(n)]
    out: list[list[int]] = [[] for _ in range(n)]
    active = list(range(n))
    produced = 0
    with torch.inference_mode(), _attention(model, "eager"):
        while active:
            real = logits[: len(active)]
            check_finite(real, getattr(backend, "name", "the model"))
            job.step(real, active)
            nxt = sample_next(real, sampling, [gens[r] for r in active] if gens else None)
            keep = []
            for i, row in enumerate(active):
                tok = int(nxt[i])
                out[row].append(tok)
                job.accept(row, tok)
                if not job.finished(row) and len(out[row]) < sampling.max_new_tokens:
                    keep.append(i)
            if not keep:
                break
            order = keep + [keep[0]] * (slots - len(keep))
            if len(keep) < len(active):
                sel = torch.tensor(order, device=dev)
                cache.batch_select_indices(sel)
                key_mask = key_mask[sel]
                active = [active[i] for i in keep]
            tokens = nxt[torch.tensor(order, device=dev)]
            key_mask = torch.cat([key_mask, torch.ones(slots, 1, dtype=torch.long, device=dev)], 1)
            source = active + [active[0]] * (slots - len(active))
            pos = torch.tensor([[base_pos[r] + produced] for r in source], device=dev)
            fwd = model(
                input_ids=tokens[:, None],
                attention_mask=key_mask,
                position_ids=pos,
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            )
            logits = fwd.logits[:, -1, :].float()
            produced += 1
            if job.stats is not None:
                job.stats.decode_steps += 1
                job.stats.decode_tokens += len(active)
    return out


SUFFIX_BUCKET = 16


def prefix_cache(backend: Any, prefix_ids: Sequence[int]) -> Any:
    """KV cache of one shared prefix, computed once at its exact length (no padding)."""
    if not prefix_ids:
        raise ValueError("empty prefix")
    cache = new_cache(backend.model)
    ids = torch.tensor([list(prefix_ids)], dtype=torch.long, device=backend.model.device)
    with torch.inference_mode(), _attention(backend.model, "sdpa"):
        backend.model.base_model(input_ids=ids, past_key_values=cache, use_cache=True)
    return cache


def _copy_cache(cache: Any, rows: int) -> Any:
    new = copy.deepcopy(cache)
    new.batch_repeat_interleave(rows)
    return new


def shared_prefix_decode(
    backend: Any,
    prefix_ids: Sequence[int],
    suffix_ids: Sequence[Sequence[int]],
    job: EngineJob,
    cache: Any = None,
) -> list[list[int]]:
    """Decode many suffixes after one shared prefix whose KV cache is computed once (or
    given as ``cache``).

    Suffixes are grouped by their padded width (their length rounded up to ``SUFFIX_BUCKET``);
    each chunk of ``job.rows`` suffixes of one width copies the prefix cache, prefills the
    suffixes (always ``job.rows`` rows) and decodes. Every row sees exactly the same shapes
    whether it is alone or in a full chunk, so a suffix's result does not depend on the others.
    """
    if cache is None:
        cache = prefix_cache(backend, prefix_ids)
        if job.stats is not None:
            job.stats.prefill_tokens += len(prefix_ids)
    if min((len(s) for s in suffix_ids), default=1) < 1:
        raise ValueError("empty suffix")
    # a chunk's width is its rows' own width, never a neighbour's
    parts = chunks(_by_width(suffix_ids, SUFFIX_BUCKET), job.rows)
    return by_rows(len(suffix_ids), parts, lambda rows: _suffix_chunk(
        backend, len(prefix_ids), [list(suffix_ids[r]) for r in rows], job.subset(rows),
        cache))  # fmt: skip


def _suffix_chunk(backend: Any, plen: int, chunk: list[list[int]], job: EngineJob, cache: Any):
    """Up to ``job.rows`` suffixes of one width after the prefix ``cache`` (``plen`` tokens),
    prefilled and decoded in ``job.rows`` slots."""
    model = backend.model
    dev = model.device
    slots = job.rows
    lens = [len(c) for c in chunk]
    width = bucket_width(max(lens), SUFFIX_BUCKET)
    ids = torch.full((slots, width), backend.tokenizer.pad_token_id, dtype=torch.long, device=dev)
    for r in range(slots):
        src = chunk[r] if r < len(chunk) else chunk[0]
        ids[r, : len(src)] = torch.tensor(src, dtype=torch.long, device=dev)
    slot_lens = lens + [lens[0]] * (slots - len(chunk))
    c = _copy_cache(cache, slots)
    pos = torch.arange(plen, plen + width, device=dev)[None].expand(slots, -1)
    with torch.inference_mode(), _attention(model, "sdpa"):
        hidden = model.base_model(
            input_ids=ids, position_ids=pos, past_key_values=c, use_cache=True
        ).last_hidden_state
        last = hidden[torch.arange(slots, device=dev), torch.tensor(slot_lens, device=dev) - 1]
        logits = model.get_output_embeddings()(last).float()
    key_mask = torch.zeros(slots, plen + width, dtype=torch.long, device=dev)
    key_mask[:, :plen] = 1
    for r, length in enumerate(slot_lens):
        key_mask[r, plen : plen + length] = 1
    if job.stats is not None:
        job.stats.prefill_tokens += sum(lens)
        job.stats.rows += len(chunk)
    return _loop(backend, logits, c, key_mask, [plen + x for x in lens], job)
