"""The fast engine's attention: the rows' own key/value buffers (``_Rows``) and the
kernels that attend over a shared prefix, read in place, and each row's own slots, merged
by one softmax (``recjudge.llm._fast`` states the formula).

Registered as ``ATTN_NAME`` with the native forward's registry (``recjudge.llm._native``)
and, for transformers models, with transformers' ``AttentionInterface``; it runs only
inside ``fast_attention(model)`` with the rows of the call at hand set (``_forward``). On
the CPU the prefix blocks are computed by torch's flash kernel in the model's dtype and
merged with the rows' own fp32 block by log-sum-exps; elsewhere in fp32 as written.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from recjudge.llm._engine import _attention
from recjudge.llm._native import NativeCausalLM, register_attention
from recjudge.llm._prefix_cache import PrefixKV

ATTN_NAME = "recjudge_prefix"


_STATE: contextvars.ContextVar[_Rows | None] = contextvars.ContextVar("recjudge_rows", default=None)


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


register_attention(ATTN_NAME, _prefix_attention)  # native models read it from here on


def _register(model: Any) -> None:
    """The engine's attention known to a transformers ``model`` too: transformers'
    ``AttentionInterface``, imported only for such models (native ones have it since this
    module's import)."""
    if isinstance(model, NativeCausalLM):
        return
    # transformers loads with a model, not with this module
    from transformers import AttentionInterface  # noqa: PLC0415

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


__all__ = ["ATTN_NAME", "fast_attention"]
