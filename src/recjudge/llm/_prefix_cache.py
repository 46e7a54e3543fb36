"""The fast engine's prefix caches: one prompt prefix's keys and values (``PrefixKV``),
computed once at its exact length, and the most recently used ones per backend
(``PrefixLRU``), shared by every judge, mode and beta on that backend."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from recjudge.llm._engine import EngineStats, _attention
from recjudge.llm._native import new_cache


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


__all__ = ["PrefixKV", "PrefixLRU", "encode_prefix", "prefixes_of"]
