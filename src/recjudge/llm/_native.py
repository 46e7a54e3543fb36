"""A native forward for Llama-family checkpoints, loaded without transformers' modelling code.

A cold judgment spent most of its start-up importing transformers' modelling stack
(``modeling_utils`` pulls in ``torch.distributed``, ``torch._dynamo``, FSDP, sympy, the loss
and kernel-hub modules: ~6 s of a 15 s CLI judgment on a 2-core CPU) to run a model whose
forward is a few dozen lines. ``NativeCausalLM`` is that forward in plain torch, with the
attribute names, weights and operations of transformers' ``LlamaForCausalLM`` /
``Qwen2ForCausalLM`` / ``Qwen3ForCausalLM`` / ``MistralForCausalLM``, op for op:

    h_0      = embed(ids)
    a_l      = attn(rms_norm(h_l)) ;  h_l' = h_l + o_proj(a_l)
    h_{l+1}  = h_l' + down(silu(gate(rms_norm(h_l'))) * up(rms_norm(h_l')))
    rms_norm(x) = w * (x / sqrt(mean(x^2) + eps))      (in fp32, cast back, as transformers)
    rope(x)  = x cos(p theta) + rotate_half(x) sin(p theta),  theta_i = base^(-2i/d)

so the engines (``recjudge.llm._fast``) run on it unchanged: the same attention hook
(``config._attn_implementation``: ``sdpa``, ``eager`` or a function registered with
``register_attention``), ``base_model(...).last_hidden_state``, ``get_output_embeddings()``.

The batch-invariant engine (``recjudge.llm._engine``) runs on it too, with ``NativeCache`` in
place of ``DynamicCache`` (``new_cache``). What needs transformers itself (``generate()`` with
logits processors, the benchmarks' naive baselines) asks the backend for
``transformers_model()``, which loads the transformers twin on first use and makes it share
this model's weights.

Supported (``native_support``): a local folder with ``config.json`` and safetensors weights, of
model type llama, qwen2, qwen3 or mistral, default RoPE, SiLU MLP, full attention, not
quantized. Anything else loads through transformers as before.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from recjudge._util import json_loads

NATIVE_TYPES = frozenset({"llama", "qwen2", "qwen3", "mistral"})
#: attention functions by name, as transformers' ``AttentionInterface`` holds them for its models
_ATTENTION: dict[str, Callable[..., tuple[torch.Tensor, Any]]] = {}


def register_attention(name: str, fn: Callable[..., tuple[torch.Tensor, Any]]) -> None:
    """Make ``fn`` the attention of native models whose ``config._attn_implementation`` is
    ``name`` (the signature of transformers' attention functions:
    ``fn(module, query, key, value, attention_mask, scaling=..., dropout=...)`` with
    ``query`` ``[B, H, L, D]``, returning ``([B, L, H, D], weights or None)``)."""
    _ATTENTION[name] = fn


class NativeConfig(SimpleNamespace):
    """A checkpoint's ``config.json`` as attributes (what the engines read: ``model_type``,
    ``num_hidden_layers``, ``num_key_value_heads``, ``head_dim``, ...)."""

    _attn_implementation: str = "sdpa"

    @property
    def head_dim_(self) -> int:
        return int(getattr(self, "head_dim", None) or self.hidden_size // self.num_attention_heads)

    @property
    def rope(self) -> dict[str, Any]:
        """RoPE settings: transformers 5's ``rope_parameters``, or 4.x's ``rope_theta`` and
        ``rope_scaling``."""
        params = getattr(self, "rope_parameters", None)
        if params:
            return dict(params)
        scaling = getattr(self, "rope_scaling", None) or {}
        return {
            "rope_theta": getattr(self, "rope_theta", 10000.0),
            "rope_type": scaling.get("rope_type", scaling.get("type", "default")),
        }


def read_config(folder: Path) -> NativeConfig:
    return NativeConfig(**json_loads((folder / "config.json").read_text(encoding="utf-8")))


def _weight_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json_loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        for s in shards:  # a shard is a file of this folder, never a path out of it
            if not isinstance(s, str) or Path(s).name != s or s in (".", ".."):
                raise ValueError(f"{index}: shard {s!r} is not a file name in {folder}")
        return [folder / s for s in shards]
    single = folder / "model.safetensors"
    return [single] if single.is_file() else []


#: (what the native forward does not implement, how to say so), checked in order
_NOT_NATIVE: tuple[tuple[Callable[[Any], Any], Callable[[Any], str]], ...] = (
    (lambda c: getattr(c, "model_type", None) not in NATIVE_TYPES,
     lambda c: f"model type {getattr(c, 'model_type', None)!r} is not native"),
    (lambda c: getattr(c, "quantization_config", None), lambda c: "quantized checkpoint"),
    (lambda c: c.rope.get("rope_type", "default") != "default",
     lambda c: f"RoPE type {c.rope.get('rope_type')!r}"),
    (lambda c: getattr(c, "hidden_act", "silu") != "silu",
     lambda c: f"activation {c.hidden_act!r}"),
    (lambda c: getattr(c, "use_sliding_window", False)
     or (c.model_type == "mistral" and getattr(c, "sliding_window", None)),
     lambda c: "sliding-window attention"),
    (lambda c: any(t != "full_attention" for t in getattr(c, "layer_types", None) or []),
     lambda c: "mixed attention layers"),
    (lambda c: getattr(c, "mlp_bias", False), lambda c: "MLP biases"),
)  # fmt: skip


def native_support(source: Any) -> str | None:
    """``None`` when ``source`` loads natively, else why not (it then loads through
    transformers)."""
    folder = Path(str(source))
    if not folder.is_dir() or not (folder / "config.json").is_file():
        return "not a local folder with config.json"
    try:
        cfg = read_config(folder)
    except (OSError, ValueError, TypeError) as e:
        return f"config.json unreadable: {e}"
    for unsupported, why in _NOT_NATIVE:
        if unsupported(cfg):
            return why(cfg)
    if not _weight_files(folder):
        return "no safetensors weights"
    return None


#: oneDNN's linear on a weight reordered once into its blocked layout, and that reorder (what
#: inductor's weight freezing does on the CPU); ``None`` where torch was built without oneDNN
_PACKED_LINEAR = getattr(torch.ops.mkldnn, "_linear_pointwise", None)
_REORDER = getattr(torch.ops.mkldnn, "_reorder_linear_weight", None)
_BF16_PACKS = _REORDER is not None and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
#: oneDNN's bf16 linear needs AVX512-BW/VL/DQ or AVX-NE-CONVERT (it raises on an AVX2-only CPU,
#: where torch emulates bf16 and ``F.linear`` stays)
_PACKED_DTYPES = (torch.float32, torch.bfloat16) if _BF16_PACKS else (torch.float32,)
_PACKING: contextvars.ContextVar[bool] = contextvars.ContextVar("recjudge_packing", default=True)


@contextlib.contextmanager
def packed_weights(enabled: bool) -> Iterator[None]:
    """Inside, ``Linear`` uses its packed weight (``enabled``, the default outside) or not:
    for an A/B (``scripts/packed_weights_ab.py``) and the tests that compare both."""
    token = _PACKING.set(enabled)
    try:
        yield
    finally:
        _PACKING.reset(token)


def drop_packed(model: nn.Module) -> None:
    """Forget every packed weight of ``model`` (memory back; after writing weights through
    ``.data``, which the packed copies cannot see: see ``Linear``)."""
    for m in model.modules():
        m.__dict__.pop("_packed_weight", None)


class Linear(nn.Linear):
    """``nn.Linear`` without a random initialisation: every weight comes from the
    checkpoint (``load_native``), and initialising them all costs seconds for a 1.5B.

    **Packed weights on the CPU.** ``F.linear`` hands the product to oneDNN (bf16) or MKL
    (fp32) with the weight in its plain layout at every call; here the weight is reordered
    once into oneDNN's blocked layout (``torch.ops.mkldnn._reorder_linear_weight``, kept
    beside the weight) and multiplied by ``torch.ops.mkldnn._linear_pointwise`` (what
    inductor's weight freezing does on the CPU). Measured on a 2-core AMD EPYC:

    - bf16: every linear shape of SmolLM2-135M and Qwen2.5 0.5B and 1.5B at 1 to 2,100 rows
      bitwise equal to ``F.linear`` (242 of 242 products), 1-6 % faster at 1,330 rows and
      6-38 % at 20 (the vocabulary heads most); the 0.5B's 20 read-outs of one user 5-12 %
      faster with the same p_yes.
    - fp32: not MKL's product bit for bit (the 0.5B's p_yes within 1.2e-6 of it, the same
      verdicts and evidence), 1.10-1.15x at 1,330 rows and 2.0-3.3x at 20 (1.02-1.05x and
      1.8-2.7x with oneDNN and MKL held to AVX2, as on an AVX2-only CPU); the 0.5B's
      read-outs 1.08-1.22x and full answers 1.26x faster (``scripts/packed_weights_ab.py``).

    The first use pays the reorder and the weights' size in memory (a first forward of every
    linear layer in bf16: 0.2 s and 256 MB for SmolLM2, 0.5-1.0 s and 942 MB for the 0.5B);
    a cold CLI judgment was still faster with it. Only without autograd (the engines run
    under ``inference_mode``), on the CPU, in fp32, and in bf16 where oneDNN computes it
    (AVX512-BW/VL/DQ or AVX-NE-CONVERT; not on an AVX2-only CPU). The packed copy is remade
    when the weight is replaced (another tensor object, or another ``data_ptr``) or changed
    in place (its version counter moves); a write through ``.data`` moves neither, so code
    that writes weights that way calls ``drop_packed``.
    """

    def reset_parameters(self) -> None:
        pass

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        packed = self._packed(x)
        if packed is None:
            return torch.nn.functional.linear(x, self.weight, self.bias)
        return _PACKED_LINEAR(x, packed, self.bias, "none", [], "")

    def _packed(self, x: torch.Tensor) -> torch.Tensor | None:
        """The packed weight for ``x``, made on first use; ``None`` where it does not apply."""
        w = self.weight
        if (
            _REORDER is None
            or w.dtype not in _PACKED_DTYPES
            or x.dtype != w.dtype
            or x.device.type != "cpu"
            or w.device.type != "cpu"
            or (torch.is_grad_enabled() and (w.requires_grad or x.requires_grad))
            or not _PACKING.get()
        ):
            return None
        key = (w.data_ptr(), -1 if w.is_inference() else w._version)
        got = self.__dict__.get("_packed_weight")
        # the weight object itself is kept and compared: a new weight allocated where a freed
        # one was would otherwise match its address and version
        if got is None or got[0] is not w or got[1] != key:
            with torch.no_grad():
                got = self.__dict__["_packed_weight"] = (w, key, _REORDER(w.detach(), None))
        return got[2]


class Embedding(nn.Embedding):
    """``nn.Embedding`` without a random initialisation (see ``Linear``)."""

    def reset_parameters(self) -> None:
        pass


class RMSNorm(nn.Module):
    """``w * x / sqrt(mean(x^2) + eps)``, computed in fp32 and cast back before the weight
    (as transformers' ``LlamaRMSNorm``)."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * h.to(dtype)


class Rotary(nn.Module):
    """Default RoPE: ``theta_i = base^(-2i/d)``; cos/sin of ``p * theta`` in fp32, cast to
    the activations' dtype."""

    def __init__(self, cfg: NativeConfig) -> None:
        super().__init__()
        base, dim = float(cfg.rope["rope_theta"]), cfg.head_dim_
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = pos[..., None].float() * self.inv_freq.to(device=x.device, dtype=torch.float)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    if groups == 1:
        return x
    b, nkv, n, d = x.shape
    return x[:, :, None].expand(b, nkv, groups, n, d).reshape(b, nkv * groups, n, d)


def sdpa_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **_):
    """torch's ``scaled_dot_product_attention`` (causal flag when no mask is given and the
    queries are the keys' last ones, as transformers' ``sdpa``)."""
    q_len, kv_len = query.shape[2], key.shape[2]
    is_causal = q_len > 1 and attention_mask is None
    if is_causal and kv_len > q_len:  # a cache before the queries: an explicit offset mask
        attention_mask = _causal_mask(1, q_len, kv_len, query.dtype, query.device)
        is_causal = False
    out = torch.nn.functional.scaled_dot_product_attention(
        query, _repeat_kv(key, module.num_key_value_groups),
        _repeat_kv(value, module.num_key_value_groups),
        attn_mask=attention_mask, scale=scaling, is_causal=is_causal,
    )  # fmt: skip
    return out.transpose(1, 2).contiguous(), None


def eager_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **_):
    """``softmax(q k^T * scale + mask) v`` with the softmax in fp32 (transformers' ``eager``)."""
    k = _repeat_kv(key, module.num_key_value_groups)
    v = _repeat_kv(value, module.num_key_value_groups)
    w = torch.matmul(query, k.transpose(2, 3)) * scaling
    if attention_mask is None and query.shape[2] > 1:
        attention_mask = _causal_mask(1, query.shape[2], k.shape[2], query.dtype, query.device)
    if attention_mask is not None:
        w = w + attention_mask
    w = torch.softmax(w, dim=-1, dtype=torch.float32).to(query.dtype)
    return torch.matmul(w, v).transpose(1, 2).contiguous(), w


register_attention("sdpa", sdpa_attention)
register_attention("eager", eager_attention)


def _attention_fn(name: str) -> Callable[..., tuple[torch.Tensor, Any]]:
    """The registered attention ``name``; ``ValueError`` when there is none."""
    fn = _ATTENTION.get(name)
    if fn is None:
        raise ValueError(f"no attention {name!r} registered for native models")
    return fn


def _causal_mask(
    batch: int, q_len: int, kv_len: int, dtype: torch.dtype, device: Any,
    keys: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    """Additive mask ``[B, 1, q, kv]``: query ``i`` (at key index ``kv - q + i``) sees keys at
    or before it that ``keys`` (``[B, kv]``, 1 = real) marks real. Masked entries hold the
    dtype's lowest finite value, not -inf, so a row with nothing to see (a left pad) gives
    finite numbers that no real row reads."""
    qi = torch.arange(kv_len - q_len, kv_len, device=device)[:, None]
    ki = torch.arange(kv_len, device=device)[None]
    seen = (ki <= qi)[None, None].expand(batch, 1, q_len, kv_len)
    if keys is not None:
        seen = seen & keys[:, None, None, -kv_len:].bool()
    low = torch.finfo(dtype).min
    return torch.zeros(seen.shape, dtype=dtype, device=device).masked_fill(~seen, low)


class Attention(nn.Module):
    def __init__(self, cfg: NativeConfig, layer_idx: int) -> None:
        super().__init__()
        self.config, self.layer_idx = cfg, layer_idx
        self.head_dim = cfg.head_dim_
        heads, kv = cfg.num_attention_heads, cfg.num_key_value_heads
        self.num_key_value_groups = heads // kv
        self.scaling = self.head_dim**-0.5
        self.is_causal = True
        bias = True if cfg.model_type == "qwen2" else bool(getattr(cfg, "attention_bias", False))
        self.q_proj = Linear(cfg.hidden_size, heads * self.head_dim, bias=bias)
        self.k_proj = Linear(cfg.hidden_size, kv * self.head_dim, bias=bias)
        self.v_proj = Linear(cfg.hidden_size, kv * self.head_dim, bias=bias)
        o_bias = bool(getattr(cfg, "attention_bias", False)) and cfg.model_type != "qwen2"
        self.o_proj = Linear(heads * self.head_dim, cfg.hidden_size, bias=o_bias)
        if cfg.model_type == "qwen3":  # per-head norms of queries and keys, before RoPE
            self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)

    def forward(self, h, rope, mask, cache):
        shape = (*h.shape[:-1], -1, self.head_dim)
        q, k = self.q_proj(h).view(shape), self.k_proj(h).view(shape)
        if self.config.model_type == "qwen3":
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = self.v_proj(h).view(shape).transpose(1, 2)
        cos, sin = rope[0].unsqueeze(1), rope[1].unsqueeze(1)
        q = (q * cos) + (_rotate_half(q) * sin)
        k = (k * cos) + (_rotate_half(k) * sin)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)
        fn = _attention_fn(self.config._attn_implementation)
        out, _ = fn(self, q, k, v, mask, scaling=self.scaling, dropout=0.0)
        return self.o_proj(out.reshape(*h.shape[:-1], -1).contiguous())


class MLP(nn.Module):
    def __init__(self, cfg: NativeConfig) -> None:
        super().__init__()
        self.gate_proj = Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: NativeConfig, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = Attention(cfg, layer_idx)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, h, rope, mask, cache):
        h = h + self.self_attn(self.input_layernorm(h), rope, mask, cache)
        return h + self.mlp(self.post_attention_layernorm(h))


@dataclass
class _CacheLayer:
    keys: torch.Tensor
    values: torch.Tensor


class NativeCache:
    """Keys and values per layer, ``[B, kv_heads, length, head_dim]``, grown by
    concatenation (the layout of transformers' ``DynamicCache``: ``layers[i].keys``)."""

    def __init__(self) -> None:
        self.layers: list[_CacheLayer] = []

    def update(self, k: torch.Tensor, v: torch.Tensor, layer_idx: int):
        if layer_idx == len(self.layers):
            self.layers.append(_CacheLayer(k, v))
        else:
            entry = self.layers[layer_idx]
            entry.keys = torch.cat([entry.keys, k], dim=-2)
            entry.values = torch.cat([entry.values, v], dim=-2)
        return self.layers[layer_idx].keys, self.layers[layer_idx].values

    def get_seq_length(self) -> int:
        return int(self.layers[0].keys.shape[-2]) if self.layers else 0

    def batch_select_indices(self, idx: torch.Tensor) -> None:
        """Keep rows ``idx`` (in that order) of every layer."""
        for entry in self.layers:
            entry.keys, entry.values = entry.keys[idx], entry.values[idx]

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Each row ``repeats`` times in a row (``DynamicCache``'s method of that name)."""
        for entry in self.layers:
            entry.keys = entry.keys.repeat_interleave(repeats, dim=0)
            entry.values = entry.values.repeat_interleave(repeats, dim=0)


def new_cache(model: Any) -> Any:
    """An empty KV cache for ``model``: ``NativeCache`` for a native model, transformers'
    ``DynamicCache`` for a transformers one."""
    if isinstance(model, NativeCausalLM):
        return NativeCache()
    # transformers loads with a model, not with this module
    from transformers import DynamicCache  # noqa: PLC0415

    return DynamicCache(config=model.config)


class NativeModel(nn.Module):
    """The decoder stack (transformers' ``model.model``)."""

    def __init__(self, cfg: NativeConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary_emb = Rotary(cfg)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        past_key_values: NativeCache | None = None,
        use_cache: bool = False,
        **_: Any,
    ) -> SimpleNamespace:
        """``attention_mask``: ``[B, kv]`` (1 = a real token: padding masked, causal added),
        a 4-D mask (given to the attention as it is), or ``None`` (causal)."""
        h = self.embed_tokens(input_ids)
        if use_cache and past_key_values is None:
            past_key_values = NativeCache()
        past = past_key_values.get_seq_length() if past_key_values is not None else 0
        if position_ids is None:
            position_ids = (torch.arange(h.shape[1], device=h.device) + past)[None]
        mask = attention_mask
        if mask is not None and mask.dim() == 2:
            # no padding: causal only (sdpa's causal kernel, as transformers picks it)
            mask = None if bool(mask.all()) else _causal_mask(
                h.shape[0], h.shape[1], past + h.shape[1], h.dtype, h.device, keys=mask
            )  # fmt: skip
        rope = self.rotary_emb(h, position_ids)
        for layer in self.layers:
            h = layer(h, rope, mask, past_key_values)
        return SimpleNamespace(last_hidden_state=self.norm(h), past_key_values=past_key_values)


class NativeCausalLM(nn.Module):
    """A Llama-family causal LM (transformers' ``*ForCausalLM`` layout and forward)."""

    def __init__(self, cfg: NativeConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = NativeModel(cfg)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if getattr(cfg, "tie_word_embeddings", False):
            self.lm_head.weight = self.model.embed_tokens.weight
        self.generation_config = SimpleNamespace(
            eos_token_id=getattr(cfg, "eos_token_id", None),
            pad_token_id=getattr(cfg, "pad_token_id", None),
        )

    @property
    def base_model(self) -> NativeModel:
        return self.model

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_attn_implementation(self, name: str) -> None:
        _attention_fn(name)  # an unknown name fails here, not at the next forward
        self.config._attn_implementation = name

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        past_key_values: NativeCache | None = None,
        use_cache: bool = False,
        logits_to_keep: int = 0,
        **_: Any,
    ) -> SimpleNamespace:
        out = self.model(input_ids, attention_mask, position_ids, past_key_values, use_cache)
        h = out.last_hidden_state
        if logits_to_keep:
            h = h[:, -logits_to_keep:]
        return SimpleNamespace(logits=self.lm_head(h), past_key_values=out.past_key_values)


def load_native(folder: Path, dtype: torch.dtype) -> NativeCausalLM:
    """The checkpoint in ``folder`` (see ``native_support``) in ``dtype`` on the CPU.

    Raises:
        ValueError: the weights do not match the architecture (a missing or unexpected
            tensor, a wrong shape), naming the tensor.
    """
    # safetensors loads with the weights, not with this module
    from safetensors.torch import load_file  # noqa: PLC0415

    cfg = read_config(folder)
    # built with uninitialised tensors (``Linear.reset_parameters`` does nothing: no random
    # init to pay for), then every parameter is replaced by the checkpoint's
    model = NativeCausalLM(cfg)
    state: dict[str, torch.Tensor] = {}
    for path in _weight_files(folder):
        state.update(load_file(str(path)))
    expected = dict(model.named_parameters())
    if getattr(cfg, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
        expected.pop("lm_head.weight", None)
    missing = sorted(set(expected) - set(state))
    extra = sorted(k for k in set(state) - set(expected) if not k.endswith("rotary_emb.inv_freq"))
    if missing or extra:
        raise ValueError(
            f"{folder}: weights do not match a {cfg.model_type} model: missing "
            f"{missing[:3]}, unexpected {extra[:3]}"
        )
    for name, p in expected.items():
        if tuple(state[name].shape) != tuple(p.shape):
            raise ValueError(
                f"{folder}: tensor {name} has shape {tuple(state[name].shape)}, the config "
                f"says {tuple(p.shape)}"
            )
    tensors = {k: state[k].to(dtype) for k in expected}
    model.load_state_dict(tensors, strict=False, assign=True)
    if getattr(cfg, "tie_word_embeddings", False):
        model.lm_head.weight = model.model.embed_tokens.weight
    return model.eval()


__all__ = [
    "NATIVE_TYPES",
    "NativeCache",
    "NativeCausalLM",
    "NativeConfig",
    "drop_packed",
    "load_native",
    "native_support",
    "new_cache",
    "packed_weights",
    "register_attention",
]
