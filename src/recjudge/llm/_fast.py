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
"""

from __future__ import annotations

import contextlib
import contextvars
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from recjudge.llm._config import SamplingConfig
from recjudge.llm._engine import (
    EngineStats,
    _attention,
    check_finite,
    remap_hooks,
    sample_next,
)
from recjudge.llm._native import NativeCausalLM, new_cache, register_attention

ATTN_NAME = "recjudge_prefix"
_FAST_TYPES = {"llama", "qwen2", "qwen3", "mistral", "granite", "olmo2", "smollm3"}
_STATE: contextvars.ContextVar[_Rows | None] = contextvars.ContextVar("recjudge_rows", default=None)


def supports_fast(model: Any) -> bool:
    """Whether ``model`` can run on this engine (full causal attention, functional API)."""
    cfg = model.config
    if cfg.model_type not in _FAST_TYPES:
        return False
    if getattr(cfg, "use_sliding_window", False) and getattr(cfg, "sliding_window", None):
        return False
    types = getattr(cfg, "layer_types", None) or ["full_attention"]
    return all(t == "full_attention" for t in types)


@dataclass
class PrefixKV:
    """Keys and values of one prompt prefix: per layer ``[kv_heads, length, head_dim]``, fp32.

    ``typed(dtype)`` gives them in the model's dtype for the CPU flash kernels (made once;
    they came out of that dtype's projections, so the cast back loses nothing)."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    length: int
    _typed: dict[torch.dtype, tuple[list[torch.Tensor], list[torch.Tensor]]] = field(
        default_factory=dict, repr=False
    )

    def typed(self, dtype: torch.dtype) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        if dtype == torch.float32:
            return self.keys, self.values
        if dtype not in self._typed:
            self._typed[dtype] = ([k.to(dtype) for k in self.keys],
                                  [v.to(dtype) for v in self.values])  # fmt: skip
        return self._typed[dtype]

    def nbytes(self) -> int:
        extra = [t for ks, vs in self._typed.values() for t in ks + vs]
        return sum(t.numel() * t.element_size() for t in self.keys + self.values + extra)


def encode_prefix(backend: Any, prefix_ids: Sequence[int]) -> PrefixKV:
    """Prefill ``prefix_ids`` once (exact length, sdpa) and keep its keys and values."""
    if not prefix_ids:
        raise ValueError("empty prefix")
    model = backend.model
    cache = new_cache(model)
    ids = torch.tensor([list(prefix_ids)], dtype=torch.long, device=model.device)
    with torch.inference_mode(), _attention(model, "sdpa"):
        model.base_model(input_ids=ids, past_key_values=cache, use_cache=True)
        keys = [layer.keys[0].float().contiguous() for layer in cache.layers]
        values = [layer.values[0].float().contiguous() for layer in cache.layers]
    return PrefixKV(keys, values, len(prefix_ids))


class PrefixLRU:
    """The most recently used prefix caches of one backend, by (engine, prefix ids).

    Judges of every mode and beta share them, so ablations and beta sweeps over one user's
    candidates encode the user's history once. Entries are read-only.
    """

    def __init__(self, slots: int = 2) -> None:
        self.base = self.slots = slots
        self._items: OrderedDict[tuple[str, tuple[int, ...]], Any] = OrderedDict()

    def reserve(self, engine: str, prefixes: Sequence[Sequence[int]]) -> None:
        """Room for the prefixes of the call at hand (several users' rows decoded together
        must not evict their own prefixes: a next call on the same users reuses them), and no
        more than that call or the base size needs: a call of 64 one-candidate users must not
        leave 64 prefix caches behind for the rest of the run. The entries dropped are the
        least recently used of those this call does not need: a call on one of the last
        call's users finds that user's prefix, however many users the last call had."""
        need = {(engine, tuple(p)) for p in prefixes}
        self.slots = max(self.base, len(need))
        for key in [k for k in self._items if k not in need]:  # oldest first
            if len(self._items) <= self.slots:
                break
            del self._items[key]

    def get(
        self,
        engine: str,
        prefix_ids: Sequence[int],
        build: Callable[[], Any],
        stats: EngineStats | None = None,
    ) -> Any:
        key = (engine, tuple(prefix_ids))
        if key in self._items:
            self._items.move_to_end(key)
            return self._items[key]
        value = build()
        if stats is not None:
            stats.prefill_tokens += len(prefix_ids)
        self._items[key] = value
        while len(self._items) > self.slots:
            self._items.popitem(last=False)
        return value

    def clear(self) -> None:
        self._items.clear()


def prefixes_of(backend: Any) -> PrefixLRU:
    """The backend's prefix caches (created on first use)."""
    lru = getattr(backend, "prefixes", None)
    if lru is None:
        lru = backend.prefixes = PrefixLRU()
    return lru


def decode_shared(
    backend: Any,
    prefixes: Sequence[Sequence[int]],
    prefix_of: Sequence[int],
    suffix_ids: Sequence[Sequence[int]],
    step: Callable[[torch.Tensor, list[int]], None],
    accept: Callable[[int, int], None],
    finished: Callable[[int], bool],
    *,
    sampling: SamplingConfig | None = None,
    seeds: Sequence[int] | None = None,
    stats: EngineStats | None = None,
    deterministic: bool = False,
    rows: int = 8,
    allowed: Callable[[list[int]], torch.Tensor | None] | None = None,
    draft: Callable[[int], list[int]] | None = None,
) -> list[list[int]]:
    """Decode suffixes, row ``i`` after ``prefixes[prefix_of[i]]``, on the fast engine (rows
    of every prefix together, each prefix encoded once), or prefix by prefix on the
    batch-invariant engine with ``deterministic`` (or for a model the fast engine does not
    support).

    ``rows``: rows per decode batch (with ``deterministic``, the fixed row count that makes
    results batch-invariant; else only a memory bound).
    ``allowed(rows)``: the token ids any of the rows may take next (sorted int64, or None
    for any), known before the step: the fast engine then computes the LM head only for
    them (see ``_Head``), the rest come as ``-inf``, and ``step`` is called as
    ``step(scores, rows, columns)`` with the ids computed, so it can read and mask those
    columns only (it must still mask them).
    ``draft(row)``: token ids the row will probably take next (the grammar's forced text):
    the fast engine feeds them with the row's token and keeps those the model chooses
    (``_loop``); the invariant engine ignores them.
    """
    from recjudge.llm._engine import prefix_cache, shared_prefix_decode

    n = len(suffix_ids)
    if len(prefix_of) != n or any(not 0 <= g < len(prefixes) for g in prefix_of):
        raise ValueError(f"prefix_of must give each of {n} rows one of {len(prefixes)} prefixes")
    sampling = sampling or SamplingConfig()
    seeds = list(seeds) if seeds is not None else [sampling.seed + r for r in range(n)]
    lru = prefixes_of(backend)
    invariant = deterministic or not supports_fast(backend.model)
    lru.reserve("invariant" if invariant else "fast", prefixes)
    if invariant:
        out: list[list[int]] = [[] for _ in range(n)]
        for g, prefix_ids in enumerate(prefixes):  # one prefix cache at a time
            idx = [i for i in range(n) if prefix_of[i] == g]
            if not idx:
                continue
            cache = lru.get("invariant", prefix_ids,
                            lambda p=prefix_ids: prefix_cache(backend, p), stats)  # fmt: skip
            got = shared_prefix_decode(
                backend, prefix_ids, [suffix_ids[i] for i in idx],
                *remap_hooks(idx, step, accept, finished),
                sampling=sampling, seeds=[seeds[i] for i in idx], stats=stats, cache=cache,
                decode_rows=rows,
            )  # fmt: skip
            for i, toks in zip(idx, got, strict=True):
                out[i] = toks
        return out
    kvs = [lru.get("fast", p, lambda p=p: encode_prefix(backend, p), stats) for p in prefixes]
    return fast_decode(
        backend, kvs, prefix_of, suffix_ids, step, accept, finished, sampling=sampling,
        seeds=seeds, stats=stats, max_rows=max(rows, 1), allowed=allowed, draft=draft,
    )  # fmt: skip


def decode_prompts(
    backend: Any,
    prompt_ids: Sequence[Sequence[int]],
    step: Callable[[torch.Tensor, list[int]], None],
    accept: Callable[[int, int], None],
    finished: Callable[[int], bool],
    *,
    sampling: SamplingConfig | None = None,
    seeds: Sequence[int] | None = None,
    stats: EngineStats | None = None,
    deterministic: bool = False,
    rows: int = 8,
    draft: Callable[[int], list[int]] | None = None,
) -> list[list[int]]:
    """Decode independent prompts. On the fast engine, each batch of ``rows`` prompts shares
    its longest common token prefix (chat templates and instructions usually give one) and
    only the rest is prefilled per row."""
    from recjudge.llm._engine import constrained_decode

    sampling = sampling or SamplingConfig()
    n = len(prompt_ids)
    seeds = list(seeds) if seeds is not None else [sampling.seed + r for r in range(n)]
    if deterministic or not supports_fast(backend.model):
        return constrained_decode(
            backend, prompt_ids, step, accept, finished, sampling=sampling, seeds=seeds,
            stats=stats, decode_rows=rows,
        )  # fmt: skip
    out: list[list[int]] = []
    rows = max(rows, 1)
    for b in range(0, n, rows):
        chunk = [list(p) for p in prompt_ids[b : b + rows]]
        idx = list(range(b, b + len(chunk)))
        common = _common_prefix(chunk)
        if len(chunk) > 1 and common < MIN_SHARED:  # not worth a prefix of its own
            common = 0
        kv = encode_prefix(backend, chunk[0][:common]) if common else None
        if stats is not None:
            stats.prefill_tokens += common
        out.extend(
            fast_shared_prefix_decode(
                backend,
                kv,
                [p[common:] for p in chunk],
                *remap_hooks(idx, step, accept, finished),
                sampling=sampling,
                seeds=seeds[b : b + len(chunk)],
                stats=stats,
                max_rows=rows,
                draft=None if draft is None else lambda r, b=b: draft(b + r),
            )
        )
    return out


MIN_SHARED = 16  # tokens


def _common_prefix(prompts: list[list[int]]) -> int:
    """Length of the longest common prefix, leaving every prompt at least one own token."""
    limit = min(len(p) for p in prompts) - 1
    first = prompts[0]
    n = 0
    while n < limit and all(p[n] == first[n] for p in prompts):
        n += 1
    return n


def _spans(group: Sequence[int]) -> list[tuple[int, int, int]]:
    """``(prefix, first row, end row)`` of each run of rows sharing a prefix."""
    out: list[tuple[int, int, int]] = []
    for r, g in enumerate(group):
        if out and out[-1][0] == g:
            out[-1] = (g, out[-1][1], r + 1)
        else:
            out.append((g, r, r + 1))
    return out


class _Rows:
    """Per-row key/value buffers of one batch and the current forward's write positions.

    Buffers are ``[layers, kv_heads, rows, capacity, head_dim]``: the attended slots of a
    layer, ``k[layer, :, :, :width]``, are then a view that the batched matmul reads in place.
    (Rows before heads made that slice a transposed view, which the matmul copied: the whole
    of every row's keys and values, at every layer and step. With long per-row suffixes such
    as GISTBench's 100-object chunks, that copy cost the 1.5B 13 % of its extraction time, and
    a larger share of smaller models': ``reports/decode-rows/README.md``.)

    ``prefixes[group[r]]`` is row ``r``'s prefix (``None``: none); rows of one prefix are
    contiguous (``group`` never decreases), so ``spans`` cut the batch into one block per
    prefix.
    """

    def __init__(
        self,
        model: Any,
        prefixes: Sequence[PrefixKV | None],
        group: Sequence[int],
        capacity: int,
    ) -> None:
        cfg = model.config
        rows = len(group)
        if any(b < a for a, b in zip(group, group[1:], strict=False)):
            raise ValueError("rows must be ordered by prefix")
        self.n_kv = cfg.num_key_value_heads
        self.groups = cfg.num_attention_heads // self.n_kv
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        shape = (cfg.num_hidden_layers, self.n_kv, rows, capacity, head_dim)
        self.device = model.device
        self.k = torch.zeros(shape, device=self.device)
        self.v = torch.zeros(shape, device=self.device)
        self.prefixes = list(prefixes)
        self.group = list(group)
        self.spans = _spans(self.group)
        lengths = [p.length if p is not None else 0 for p in self.prefixes]
        self.plen = torch.tensor([lengths[g] for g in self.group], device=self.device)
        self.lens = torch.zeros(rows, dtype=torch.long, device=self.device)  # per row: filled
        self.write: torch.Tensor | None = None  # decode: one slot per row; None: prefill
        self.width = 0  # row slots attended in this forward
        #: a packed prefill's layout (``_Packed``): the rows' tokens one after another
        self.packed: _Packed | None = None
        #: a decode step's layout when rows are fed several tokens (``_packed_step``), and
        #: its additive mask ``[B, 1, L, width]``
        self.step: _Packed | None = None
        self.step_mask: torch.Tensor | None = None

    def reserve(self, width: int) -> None:
        """Room for ``width`` slots per row: the buffers grow by doubling (zeros beyond the
        filled slots: a masked slot must hold a finite value), so a short answer never pays
        for its token budget's buffers, nor ``keep`` for copying them."""
        have = self.k.shape[3]
        if width <= have:
            return
        new = max(width, 2 * have)
        shape = (*self.k.shape[:3], new, self.k.shape[4])
        k = torch.zeros(shape, device=self.device)
        v = torch.zeros(shape, device=self.device)
        k[:, :, :, :have] = self.k
        v[:, :, :, :have] = self.v
        self.k, self.v = k, v

    def keep(self, idx: torch.Tensor) -> None:
        """Keep rows ``idx`` (increasing, so rows stay ordered by prefix)."""
        self.k, self.v, self.lens = self.k[:, :, idx], self.v[:, :, idx], self.lens[idx]
        self.plen = self.plen[idx]
        self.group = [self.group[i] for i in idx.tolist()]
        self.spans = _spans(self.group)


def _with_prefix(
    q: torch.Tensor,
    s_row: torch.Tensor,
    vr: torch.Tensor,
    prefix: PrefixKV | None,
    layer: int,
    scaling: float,
) -> torch.Tensor:
    """``softmax([q K_prefix^T * scale, s_row]) [V_prefix; V_row]`` for rows of one prefix:
    ``q`` ``[nkv, B, G*Lq, D]``, ``s_row`` ``[nkv, B, G*Lq, W]``, ``vr`` ``[nkv, B, W, D]``."""
    if prefix is None:
        return torch.matmul(torch.softmax(s_row, -1), vr)
    nkv, b, gl, d = q.shape
    kp, vp = prefix.keys[layer], prefix.values[layer]  # [nkv, P, D]
    flat = q.reshape(nkv, b * gl, d)
    s_pre = (torch.matmul(flat, kp.transpose(-1, -2)) * scaling).view(nkv, b, gl, -1)
    m = torch.maximum(s_pre.amax(-1, keepdim=True), s_row.amax(-1, keepdim=True))
    e_pre = torch.exp(s_pre - m)
    e_row = torch.exp(s_row - m)
    denom = e_pre.sum(-1, keepdim=True) + e_row.sum(-1, keepdim=True)
    o_pre = torch.matmul(e_pre.view(nkv, b * gl, -1), vp).view(nkv, b, gl, d)
    return (o_pre + torch.matmul(e_row, vr)) / denom


def _prefix_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention over each row's prefix and its own slots (see the module docstring).

    ``attention_mask`` is the engine's additive row mask ``[B, 1, Lq, width]``.
    """
    st = _STATE.get()
    if st is None:
        raise RuntimeError(f"attention {ATTN_NAME!r} runs only inside the fast engine")
    layer = module.layer_idx
    if st.packed is not None:
        return _packed_prefill(st, layer, query, key, value, scaling)
    if st.write is None:
        return _prefill_attention(st, layer, query, key, value, attention_mask, scaling)
    if st.step is not None:
        return _packed_step(st, layer, query, key, value, scaling)
    rows = torch.arange(query.shape[0], device=st.device)
    st.k[layer, :, rows, st.write] = key[:, :, 0].transpose(0, 1).float()  # [nkv, B, D]
    st.v[layer, :, rows, st.write] = value[:, :, 0].transpose(0, 1).float()
    return _step_attention(st, layer, query, attention_mask, scaling), None


def _step_attention(st, layer, query, attention_mask, scaling):
    """A decode step's attention for ``query`` ``[B, H, Lq, D]`` over each row's prefix and
    its own slots ``:st.width`` (their keys and values written already), ``attention_mask``
    the additive row mask ``[B, 1, Lq, width]``; returns ``[B, Lq, H, D]`` in the query's
    dtype."""
    b, h, lq, d = query.shape
    g, nkv = st.groups, st.n_kv
    kr = st.k[layer, :, :, : st.width]  # [nkv, B, W, D], a view
    vr = st.v[layer, :, :, : st.width]
    # [nkv, B, G*Lq, D]: head h = kv * G + g, as transformers' repeat_kv.
    q = query.float().reshape(b, nkv, g * lq, d).transpose(0, 1)
    mask = attention_mask[:, 0][:, None].expand(b, g, lq, st.width).reshape(b, g * lq, -1)
    s_row = torch.matmul(q, kr.transpose(-1, -2)) * scaling + mask  # [nkv, B, G*Lq, W]
    if _cpu_flash(query.device):
        out = _merged_decode(st, layer, query, s_row, vr, scaling)
    elif len(st.spans) == 1:
        out = _with_prefix(q, s_row, vr, st.prefixes[st.spans[0][0]], layer, scaling)
    else:  # several prefixes: the prefix block per prefix, on its rows
        out = torch.cat([
            _with_prefix(q[:, a:e], s_row[:, a:e], vr[:, a:e], st.prefixes[p], layer, scaling)
            for p, a, e in st.spans
        ], 1)  # fmt: skip
    out = out.view(nkv, b, g, lq, d).permute(1, 3, 0, 2, 4).reshape(b, lq, h, d)
    return out.to(query.dtype)


def _packed_step(st, layer, query, key, value, scaling):
    """A decode step that feeds rows different numbers of tokens (``st.step``: a row's
    chosen token, then the grammar's forced draft), packed ``[1, H, T, D]``: keys and values
    go to each row's next slots, the queries are gathered per row (padded to the longest
    row, the pad queries' outputs unused), attend as a multi-token decode step (causal
    within the row's new tokens: ``st.step_mask``) and are scattered back.
    Returns ``[1, T, H, D]``."""
    pk = st.step
    dst = st.lens[pk.row] + pk.slot
    st.k[layer][:, pk.row, dst] = key[0].float()  # [nkv, T, D]
    st.v[layer][:, pk.row, dst] = value[0].float()
    rows_q = query[0][:, pk.pad].transpose(0, 1)  # [B, H, L, D]
    out = _step_attention(st, layer, rows_q, st.step_mask, scaling)  # [B, L, H, D]
    return out[pk.row, pk.slot][None], None


def _prefill_attention(st, layer, query, key, value, attention_mask, scaling):
    """The rows' own tokens of a padded batch (devices other than the CPU; the CPU packs
    them: ``_packed_prefill``), once per batch: store their keys and values and attend with
    sdpa over each row's prefix (broadcast to its rows, which may copy it per row) and the
    rows. (Attending in the two blocks of the decode steps instead, the prefix read in
    place, was 3.3x slower on the CPU: its fp32 elementwise work on [rows, heads, queries,
    prefix] scores.)"""
    lq = query.shape[2]
    k, v = key.float(), value.float()
    st.k[layer, :, :, :lq] = k.transpose(0, 1)
    st.v[layer, :, :, :lq] = v.transpose(0, 1)
    outs = []
    for p, a, e in st.spans:
        ks, vs, mask = k[a:e], v[a:e], attention_mask[a:e]
        prefix = st.prefixes[p]
        if prefix is not None:
            kp, vp = prefix.keys[layer], prefix.values[layer]
            ks = torch.cat([kp[None].expand(e - a, -1, -1, -1), ks], 2)
            vs = torch.cat([vp[None].expand(e - a, -1, -1, -1), vs], 2)
            mask = torch.cat([mask.new_zeros(e - a, 1, lq, kp.shape[1]), mask], -1)
        outs.append(torch.nn.functional.scaled_dot_product_attention(
            query[a:e].float(), ks, vs, attn_mask=mask, scale=scaling, enable_gqa=True
        ))  # fmt: skip
    out = outs[0] if len(outs) == 1 else torch.cat(outs, 0)
    return out.transpose(1, 2).to(query.dtype), None


#: torch's CPU flash-attention kernel, which also returns each query's log-sum-exp
_FLASH_CPU = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def _cpu_flash(device: torch.device) -> bool:
    """Whether the engine's CPU kernels (packed prefill, flash prefix blocks) run here."""
    return _FLASH_CPU is not None and device.type == "cpu"


def _flash_prefix(prefix: PrefixKV, layer: int, q: torch.Tensor, scaling: float):
    """One prefix block by the flash kernel: ``q`` ``[nkv, M, D]`` in the model's dtype (every
    query that reads kv head ``kv``, folded into one length: no mask, each sees the whole
    prefix) against the prefix, read in place; returns its outputs ``[nkv, M, D]`` (fp32)
    and log-sum-exps ``[nkv, M]``."""
    keys, values = prefix.typed(q.dtype)
    o, lse = _FLASH_CPU(q[None], keys[layer][None], values[layer][None], scale=scaling)[:2]
    return o[0].float(), lse[0]


def _lse_merge(o_a, l_a, o_b, l_b):
    """Attention over two key blocks from each block's own: outputs ``o`` ``[..., D]`` (fp32)
    and log-sum-exps ``l`` ``[...]``:
    ``(o_a e^{l_a} + o_b e^{l_b}) / (e^{l_a} + e^{l_b})``, shifted by the larger ``l``."""
    m = torch.maximum(l_a, l_b)
    w_a = torch.exp(l_a - m).unsqueeze(-1)
    w_b = torch.exp(l_b - m).unsqueeze(-1)
    return (o_a * w_a + o_b * w_b) / (w_a + w_b)


@dataclass
class _Packed:
    """Where each token of a packed prefill belongs: token ``t`` is row ``row[t]``'s slot
    ``slot[t]``; row ``r``'s tokens are ``start[r] : start[r] + lens[r]``; ``pad[r, j]`` is
    the packed index of row ``r``'s slot ``j`` (clamped: slots past a row's end read later
    tokens, which its causal mask shows only to pad queries, whose outputs are unused)."""

    row: torch.Tensor
    slot: torch.Tensor
    start: torch.Tensor
    lens: torch.Tensor
    pad: torch.Tensor

    @classmethod
    def of(cls, lens: torch.Tensor) -> _Packed:
        dev = lens.device
        n, total, width = len(lens), int(lens.sum()), int(lens.max())
        start = torch.cumsum(lens, 0) - lens
        row = torch.repeat_interleave(torch.arange(n, device=dev), lens)
        slot = torch.arange(total, device=dev) - start[row]
        pad = (start[:, None] + torch.arange(width, device=dev)[None]).clamp(max=total - 1)
        return cls(row, slot, start, lens, pad)


def _packed_prefill(st, layer, query, key, value, scaling):
    """A packed prefill's attention (``query`` ``[1, H, T, D]``, the rows' tokens one after
    another): keys and values go to their rows' slots; each row's own block runs causal by
    the flash kernel on a padded gather of the rows (small: suffix by suffix), each prefix's
    block on its rows' contiguous tokens folded into one flash call, merged by log-sum-exps.
    Returns ``[1, T, H, D]``."""
    pk = st.packed
    _, h, t, d = query.shape
    g, nkv = st.groups, st.n_kv
    dt = query.dtype
    q, k, v = query[0], key[0], value[0]  # [H, T, D], [nkv, T, D]
    st.k[layer][:, pk.row, pk.slot] = k.float()
    st.v[layer][:, pk.row, pk.slot] = v.float()
    # the rows' own block, padded [B, H, W, D]
    qp = q[:, pk.pad].transpose(0, 1)
    kp = k[:, pk.pad].transpose(0, 1).repeat_interleave(g, 1)
    vp = v[:, pk.pad].transpose(0, 1).repeat_interleave(g, 1)
    o_pad, l_pad = _FLASH_CPU(qp, kp, vp, is_causal=True, scale=scaling)[:2]
    o_row = o_pad[pk.row, :, pk.slot].float()  # [T, H, D]
    l_row = l_pad[pk.row, :, pk.slot]  # [T, H]
    outs = []
    for p, a, e in st.spans:
        t0 = int(pk.start[a])
        t1 = int(pk.start[e - 1] + pk.lens[e - 1])
        prefix = st.prefixes[p]
        if prefix is None:
            outs.append(o_row[t0:t1])
            continue
        n = t1 - t0
        # head kv * G + j reads kv head kv
        o_pre, l_pre = _flash_prefix(prefix, layer, q[:, t0:t1].reshape(nkv, g * n, d), scaling)
        o_pre = o_pre.reshape(h, n, d).transpose(0, 1)
        l_pre = l_pre.reshape(h, n).transpose(0, 1)
        outs.append(_lse_merge(o_pre, l_pre, o_row[t0:t1], l_row[t0:t1]))
    out = outs[0] if len(outs) == 1 else torch.cat(outs, 0)
    return out[None].to(dt), None


def _merged_decode(st, layer, query, s_row, vr, scaling):
    """A decode step's attention on the CPU: each prefix's block by the flash kernel (every
    query of its rows folded into one call against the prefix, read in place, in the
    model's dtype like the naive reference: ``_flash_prefix``), the rows' own slots in fp32
    (``s_row`` ``[nkv, B, G*Lq, W]``, masked), merged by log-sum-exps.
    Returns ``[nkv, B, G*Lq, D]`` fp32, as ``_with_prefix``."""
    m_row = s_row.amax(-1, keepdim=True)
    e_row = torch.exp(s_row - m_row)
    z_row = e_row.sum(-1, keepdim=True)
    o_row = torch.matmul(e_row, vr) / z_row
    l_row = (m_row + torch.log(z_row)).squeeze(-1)
    nkv, b, gl, _ = s_row.shape
    d = query.shape[-1]
    q = query.reshape(b, nkv, gl, d).transpose(0, 1)  # [nkv, B, G*Lq, D], the model's dtype
    outs = []
    for p, a, e in st.spans:
        prefix = st.prefixes[p]
        if prefix is None:
            outs.append(o_row[:, a:e])
            continue
        o_pre, l_pre = _flash_prefix(prefix, layer, q[:, a:e].reshape(nkv, (e - a) * gl, d),
                                     scaling)  # fmt: skip
        o_pre = o_pre.reshape(nkv, e - a, gl, d)
        l_pre = l_pre.reshape(nkv, e - a, gl)
        outs.append(_lse_merge(o_pre, l_pre, o_row[:, a:e], l_row[:, a:e]))
    return outs[0] if len(outs) == 1 else torch.cat(outs, 1)


class _Head:
    """The LM head, computed only for the tokens some row may take next when ``allowed``
    knows them (fewer than ``MAX_SHARE`` of the vocabulary): a grammar-constrained step
    (inside a title, at the decision, in the closing keys) allows a few hundred of 50-150k
    tokens, and the head is 20-30 % of a small model's weights, all read at every step.
    The other scores are ``-inf``, as the grammar mask would set them; the computed ones are
    the same dot products (up to the kernel's rounding). NaN/inf in the computed scores stop
    the run (``check_finite``)."""

    MAX_SHARE = 0.25

    def __init__(self, model: Any, allowed: Any, name: str) -> None:
        self.layer = model.get_output_embeddings()
        self.allowed = allowed
        self.name = name
        self.width = int(self.layer.weight.shape[0])

    def __call__(
        self, hidden: torch.Tensor, rows: list[int]
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(scores [B, V] fp32, the ids computed or None for all)``."""
        ids = self.allowed(rows) if self.allowed is not None else None
        if ids is not None:
            # the grammar's ids come from the CPU; the head's weight may be on a GPU
            ids = ids.to(self.layer.weight.device)
            if 0 < ids.numel() <= self.MAX_SHARE * self.width:
                bias = self.layer.bias
                sub = torch.nn.functional.linear(
                    hidden, self.layer.weight.index_select(0, ids),
                    None if bias is None else bias.index_select(0, ids),
                ).float()  # fmt: skip
                check_finite(sub, self.name)
                out = torch.full((hidden.shape[0], self.width), float("-inf"), device=hidden.device)
                out[:, ids] = sub
                return out, ids
        logits = self.layer(hidden).float()
        check_finite(logits, self.name)
        return logits, None


def _greedy(scores: torch.Tensor, columns: torch.Tensor | None) -> torch.Tensor:
    """Each row's argmax, read from ``columns`` only when every other score is -inf (the
    same token: ``columns`` is sorted, and argmax takes the first of equal maxima)."""
    if columns is None:
        return scores.argmax(-1)
    return columns[scores[:, columns].argmax(-1)]


register_attention(ATTN_NAME, _prefix_attention)  # native models read it from here on


def _register(model: Any) -> None:
    """The engine's attention known to a transformers ``model`` too: transformers'
    ``AttentionInterface``, imported only for such models (native ones have it since this
    module's import)."""
    if isinstance(model, NativeCausalLM):
        return
    from transformers import AttentionInterface

    if ATTN_NAME not in AttentionInterface._global_mapping:
        AttentionInterface.register(ATTN_NAME, _prefix_attention)


@contextlib.contextmanager
def fast_attention(model: Any):
    """``model`` runs this engine's attention inside the block (registered on first use)."""
    _register(model)
    with _attention(model, ATTN_NAME):
        yield


def _forward(model: Any, st: _Rows, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor):
    """One forward of ``ids`` ``[B, L]`` at positions ``pos``; returns the last hidden states."""
    token = _STATE.set(st)
    try:
        return model.base_model(
            input_ids=ids, position_ids=pos, attention_mask=mask, use_cache=False
        ).last_hidden_state
    finally:
        _STATE.reset(token)


def fast_shared_prefix_decode(
    backend: Any,
    prefix: PrefixKV | None,
    suffix_ids: Sequence[Sequence[int]],
    step: Callable[[torch.Tensor, list[int]], None],
    accept: Callable[[int, int], None],
    finished: Callable[[int], bool],
    **options: Any,
) -> list[list[int]]:
    """Decode every suffix after one shared prefix (``None``: no prefix): ``fast_decode``
    with one prefix."""
    n = len(suffix_ids)
    return fast_decode(backend, [prefix], [0] * n, suffix_ids, step, accept, finished, **options)


def fast_decode(
    backend: Any,
    prefixes: Sequence[PrefixKV | None],
    prefix_of: Sequence[int],
    suffix_ids: Sequence[Sequence[int]],
    step: Callable[[torch.Tensor, list[int]], None],
    accept: Callable[[int, int], None],
    finished: Callable[[int], bool],
    *,
    sampling: SamplingConfig | None = None,
    seeds: Sequence[int] | None = None,
    stats: EngineStats | None = None,
    max_rows: int = 32,
    allowed: Callable[[list[int]], torch.Tensor | None] | None = None,
    draft: Callable[[int], list[int]] | None = None,
) -> list[list[int]]:
    """Decode every suffix ``i`` after ``prefixes[prefix_of[i]]``, rows of every prefix in
    the same steps.

    Same contract as ``recjudge.llm._engine.shared_prefix_decode``: ``step(scores, rows)``
    modifies the rows' fp32 next-token scores in place (grammar mask, then bias),
    ``accept(row, token)`` follows each chosen token and ``finished(row)`` ends a row; rows
    are the caller's indices, results come back in the caller's order. Rows are decoded
    ``max_rows`` at a time, ordered by prefix. ``draft(row)``: the row's likely next tokens,
    verified in the row's next forward (``_loop``).
    """
    sampling = sampling or SamplingConfig()
    n = len(suffix_ids)
    seeds = list(seeds) if seeds is not None else [sampling.seed + r for r in range(n)]
    order = sorted(range(n), key=lambda i: prefix_of[i])  # stable: a prefix's rows together
    out: list[list[int]] = [[] for _ in range(n)]
    for b in range(0, n, max_rows):
        rows = order[b : b + max_rows]
        used = sorted({prefix_of[r] for r in rows})
        local = {p: i for i, p in enumerate(used)}
        got = _decode_chunk(
            backend,
            [prefixes[p] for p in used],
            [local[prefix_of[r]] for r in rows],
            [list(suffix_ids[r]) for r in rows],
            *remap_hooks(rows, step, accept, finished),
            sampling,
            [seeds[r] for r in rows],
            stats,
            None if allowed is None
            else lambda active, rows=rows: allowed([rows[i] for i in active]),
            None if draft is None else lambda i, rows=rows: draft(rows[i]),
        )  # fmt: skip
        for r, toks in zip(rows, got, strict=True):
            out[r] = toks
    return out


def _decode_chunk(
    backend, prefixes, group, suffixes, step, accept, finished, sampling, seeds, stats,
    allowed=None, draft=None,
):  # fmt: skip
    model = backend.model
    with torch.inference_mode(), fast_attention(model):
        st, hidden = prefill_rows(
            backend, prefixes, suffixes, sampling.max_new_tokens, stats, prefix_of=group
        )
        head = _Head(model, allowed, backend.name)
        logits, columns = head(hidden, list(range(len(suffixes))))
        return _loop(
            model, st, logits, columns, step, accept, finished, sampling, seeds, stats, head,
            draft,
        )  # fmt: skip


#: decode slots allocated per row at prefill (a judge's answer is ~20-60 tokens); more are
#: added by doubling when an answer runs longer
FIRST_ROOM = 64


def prefill_rows(
    backend: Any,
    prefix: PrefixKV | None | Sequence[PrefixKV | None],
    suffixes: Sequence[Sequence[int]],
    extra: int = 0,
    stats: EngineStats | None = None,
    prefix_of: Sequence[int] | None = None,
) -> tuple[_Rows, torch.Tensor]:
    """Prefill each row's ``suffix`` after ``prefix`` in one forward (with ``prefix_of``,
    ``prefix`` is a list and row ``r`` follows ``prefix[prefix_of[r]]``; rows ordered by
    prefix); returns the rows' buffers (room for up to ``extra`` more tokens each, grown on
    demand) and each row's last hidden state ``[B, H]``.

    Runs inside ``torch.inference_mode()`` and ``fast_attention(model)``.
    """
    model = backend.model
    dev = model.device
    n = len(suffixes)
    prefixes = list(prefix) if prefix_of is not None else [prefix]  # type: ignore[arg-type]
    group = list(prefix_of) if prefix_of is not None else [0] * n
    lens = torch.tensor([len(s) for s in suffixes], device=dev)
    if int(lens.min()) < 1:
        raise ValueError("empty suffix")
    width = int(lens.max())
    # the first steps' room; ``_Rows.reserve`` grows it as answers get longer
    st = _Rows(model, prefixes, group, width + min(extra, FIRST_ROOM))
    st.width = width
    if _cpu_flash(dev):
        # The rows' tokens one after another, no pad (a batch of one user's candidates
        # padded to its longest suffix computed 39 % pad tokens in the throughput bench).
        st.packed = pk = _Packed.of(lens)
        flat = torch.tensor([t for s in suffixes for t in s], dtype=torch.long, device=dev)
        try:
            hidden = _forward(model, st, flat[None], (st.plen[pk.row] + pk.slot)[None], None)
        finally:
            st.packed = None
        last = hidden[0, pk.start + lens - 1]
    else:
        last = _padded_prefill(backend, st, suffixes, lens, width)
    st.lens = lens.clone()
    if stats is not None:
        stats.prefill_tokens += int(lens.sum())
        stats.rows += n
    return st, last


def _padded_prefill(backend, st, suffixes, lens, width):
    """``prefill_rows`` as a ``[rows, width]`` batch (devices without the CPU kernels);
    returns each row's last hidden state."""
    model = backend.model
    dev = model.device
    n = len(suffixes)
    ids = torch.full((n, width), backend.tokenizer.pad_token_id, dtype=torch.long, device=dev)
    for r, s in enumerate(suffixes):
        ids[r, : len(s)] = torch.tensor(list(s), dtype=torch.long, device=dev)
    # Causal within each row's suffix; pad slots (at or past a row's length) are never keys.
    slot = torch.arange(width, device=dev)
    visible = (slot[None, None, :] <= slot[None, :, None]) & (
        slot[None, None, :] < lens[:, None, None]
    )
    mask = torch.zeros(n, 1, width, width, device=dev).masked_fill(~visible[:, None], float("-inf"))
    hidden = _forward(model, st, ids, st.plen[:, None] + slot[None], mask)
    return hidden[torch.arange(n, device=dev), lens - 1]


def extend_prefix(backend: Any, prefix: PrefixKV, ids: Sequence[int]) -> tuple[PrefixKV, Any]:
    """``prefix`` followed by ``ids`` as a new prefix (only ``ids`` are computed), and the
    last position's hidden state ``[H]``: a per-question context after a shared prefix, then
    shared again by many short continuations."""
    with torch.inference_mode(), fast_attention(backend.model):
        st, hidden = prefill_rows(backend, prefix, [ids])
    n = len(ids)
    keys = [torch.cat([k, st.k[i, :, 0, :n]], 1) for i, k in enumerate(prefix.keys)]
    values = [torch.cat([v, st.v[i, :, 0, :n]], 1) for i, v in enumerate(prefix.values)]
    return PrefixKV(keys, values, prefix.length + n), hidden[0]


#: most draft tokens fed per row and step: a forced span is a title's remainder or a key
#: (~5 tokens on average in evidence-heavy answers); a longer one is continued next step
MAX_DRAFT = 16


def _loop(
    model, st, logits, columns, step, accept, finished, sampling, seeds, stats, head,
    draft=None,
):  # fmt: skip
    """Decode until every row is finished; ``st`` holds the rows' prefilled slots.
    ``columns``: the ids the head computed (the other scores are -inf), passed on to
    ``step`` as its third argument so it reads only them; None: the whole vocabulary.

    ``draft(row)``: the token ids the grammar forces after the row's text (a guess of its
    next tokens, e.g. the rest of a title once its first tokens single it out). A row is then
    fed its chosen token and its draft in one forward (speculative decoding with the grammar
    as the drafter), and the outputs are read in order, as the steps they replace: each
    position's scores go through ``step`` after the tokens before it were accepted, its
    token is chosen as usual, and reading goes on while the chosen token equals the draft's
    next one. The first token that differs is the row's next token; the draft's keys and
    values after it are dropped (the row's length stops before them). So the tokens, scores
    and hooks' calls are those of one token per step, up to the rounding of a different
    batch shape; only the number of forwards drops.
    """
    n = logits.shape[0]
    gens = None
    if sampling.do_sample:
        gens = [torch.Generator(device=st.device).manual_seed(int(s) % (2**63)) for s in seeds]
    out: list[list[int]] = [[] for _ in range(n)]
    active = list(range(n))
    drafts: list[list[int]] = [[] for _ in range(n)]  # by active index
    cap = [MAX_DRAFT] * n  # each row's draft length: shrinks where the model left its drafts
    hidden: torch.Tensor | None = None  # the last forward's outputs, [tokens, H]
    starts: list[int] = []  # where each active row's tokens begin in ``hidden``
    while True:
        b = len(active)
        last = [0] * b  # each row's last chosen token
        valid = [0] * b  # tokens of this forward whose keys and values stand
        alive = [False] * b
        follow = list(range(b))  # rows still reading their outputs
        j = 0
        while follow:
            rows = [active[i] for i in follow]
            if hidden is not None:
                at = torch.tensor([starts[i] + j for i in follow], device=hidden.device)
                logits, columns = head(hidden[at], rows)
            if columns is None:
                step(logits, rows)
            else:
                step(logits, rows, columns)
            if sampling.do_sample:
                nxt = sample_next(logits, sampling, [gens[r] for r in rows])
            else:
                nxt = _greedy(logits, columns)
            more = []
            for i, tok in zip(follow, nxt.tolist(), strict=True):
                row = active[i]
                out[row].append(tok)
                accept(row, tok)
                last[i] = tok
                valid[i] += hidden is not None
                alive[i] = not finished(row) and len(out[row]) < sampling.max_new_tokens
                if alive[i] and j < len(drafts[i]) and tok == drafts[i][j]:
                    more.append(i)
            if stats is not None and j > 0:
                stats.draft_accepted += len(follow)
            follow = more
            j += 1
        if hidden is not None:
            st.lens = st.lens + torch.tensor(valid, device=st.device)
        keep = [i for i in range(b) if alive[i]]
        if not keep:
            return out
        if len(keep) < b:
            st.keep(torch.tensor(keep, device=st.device))
            active = [active[i] for i in keep]
        fed, guesses = [], []
        for i, row in zip(keep, active, strict=True):
            # A draft left before its last token (another tokenization, or the model going
            # its own way past a distinct-evidence veto) wasted the rest: the row's next
            # drafts are cut to what it took (its outputs read past the first), then doubled
            # back while they are taken (the extra tokens cost compute where a step is
            # compute-bound, as on small CPUs).
            if drafts[i]:
                took = valid[i] - 1
                ok = took >= len(drafts[i]) - 1
                cap[row] = min(2 * cap[row], MAX_DRAFT) if ok else max(took, 1)
            room = sampling.max_new_tokens - len(out[row]) - 1
            guess = draft(row)[: min(cap[row], room)] if draft is not None and room > 0 else []
            guesses.append(guess)
            fed.append([last[i], *guess])
        drafts = guesses
        hidden, starts = _step(model, st, fed)
        if stats is not None:
            stats.decode_steps += 1
            stats.decode_tokens += hidden.shape[0]
            stats.draft_tokens += hidden.shape[0] - len(fed)


def _step(model, st, fed: list[list[int]]) -> tuple[torch.Tensor, list[int]]:
    """One decode forward: row ``r`` is fed ``fed[r]`` at its next positions (one token
    each: a ``[B, 1]`` batch; else packed, ``_packed_step``). Returns the outputs
    ``[tokens, H]`` and where each row's begin."""
    dev = st.device
    b = len(fed)
    counts = torch.tensor([len(f) for f in fed], device=dev)
    wide = int(counts.max())
    st.write = st.lens.clone()
    st.width = int((st.lens + counts).max())
    st.reserve(st.width)
    slot = torch.arange(st.width, device=dev)
    # row r's query j sees its slots up to lens[r] + j (its own new tokens causally)
    sees = st.lens[:, None] + torch.arange(wide, device=dev)[None]  # [B, L]
    mask = torch.zeros(b, 1, wide, st.width, device=dev).masked_fill(
        (slot[None, None, :] > sees[:, :, None])[:, None], float("-inf")
    )
    if wide == 1:
        ids = torch.tensor([f[0] for f in fed], dtype=torch.long, device=dev)
        hidden = _forward(model, st, ids[:, None], (st.plen + st.lens)[:, None], mask)
        return hidden[:, -1], list(range(b))
    pk = _Packed.of(counts)
    flat = torch.tensor([t for f in fed for t in f], dtype=torch.long, device=dev)
    st.step, st.step_mask = pk, mask
    try:
        pos = (st.plen[pk.row] + st.lens[pk.row] + pk.slot)[None]
        hidden = _forward(model, st, flat[None], pos, None)
    finally:
        st.step = st.step_mask = None
    return hidden[0], pk.start.tolist()
