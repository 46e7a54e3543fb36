"""Compile schemas once per (schema, tokenizer) with xgrammar; token byte tables."""

from __future__ import annotations

import itertools
import json
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from recjudge.decoding._schemas import Schema, json_literal

_TABLE_IDS = itertools.count(1)


@dataclass
class TokenTable:
    """Per-tokenizer facts the processors need.

    Attributes:
        info: xgrammar TokenizerInfo sized to the logits width.
        compiler: the xgrammar GrammarCompiler for this tokenizer.
        token_bytes: the bytes each token id decodes to (empty for ids past the tokenizer).
        width: logits width (the model's vocab size, which may exceed ``len(tokenizer)``).
        stop_ids: token ids that end generation.
        uid: a serial number unique in this process (the grammar cache's key part).
    """

    info: Any
    compiler: Any
    token_bytes: list[bytes]
    width: int
    stop_ids: tuple[int, ...]
    uid: int = field(default_factory=lambda: next(_TABLE_IDS))

    def __post_init__(self) -> None:
        self._vocab = {b for b in self.token_bytes if b}
        self._max_len = max((len(b) for b in self._vocab), default=1)
        singles = bytearray(256)
        for b in self._vocab:
            if len(b) == 1:
                singles[b[0]] = 1
        self._single = bytes(singles)

    def quote_ids(self) -> Any:
        """The ids of the tokens whose text holds a ``"`` (int64 tensor, built once): the only
        tokens that can close or open a string, so the only ones the distinct-evidence veto
        checks while a string is clear of every cited one."""
        ids = getattr(self, "_quote_ids", None)
        if ids is None:
            import torch

            ids = torch.tensor([i for i, b in enumerate(self.token_bytes) if b'"' in b],
                               dtype=torch.long)  # fmt: skip
            self._quote_ids = ids
        return ids

    def producible(self, data: bytes) -> bool:
        """Whether some sequence of tokens spells exactly ``data``."""
        if all(self._single[c] for c in data):
            return True  # every byte is a token on its own
        reach = [False] * (len(data) + 1)
        reach[0] = True
        for i in range(len(data)):
            if reach[i]:
                for j in range(i + 1, min(len(data), i + self._max_len) + 1):
                    if data[i:j] in self._vocab:
                        reach[j] = True
        return reach[-1]

    def json_literal(self, s: str) -> str:
        """``s`` as a JSON literal this tokenizer can emit: raw unicode when producible, else
        ASCII ``\\u`` escapes (which parse back to the same string)."""
        lit = json_literal(s)
        return lit if self.producible(lit.encode()) else json.dumps(s, ensure_ascii=True)


@dataclass
class CompiledSchema:
    """A schema compiled for one tokenizer. Share it across requests; matchers are per row."""

    schema: Schema
    grammar: Any  # xgrammar.CompiledGrammar
    table: TokenTable

    def decision(self) -> Any:
        """The schema's decision spec with this tokenizer's literal encoding."""
        return self.schema.decision(self.table.json_literal)


class GrammarCache:
    """Token tables and compiled grammars, one explicit object (``GRAMMARS``) per process.

    Tables live as long as their tokenizer (a weak mapping from the tokenizer object itself,
    never its ``id()``, which Python reuses after garbage collection); compiled grammars are
    an LRU keyed by the schema's key and the table's serial number.

    Args:
        max_grammars: how many compiled grammars to keep.
        threads: xgrammar compiler threads.
    """

    def __init__(self, max_grammars: int = 512, threads: int = 2) -> None:
        self._tables: weakref.WeakKeyDictionary[Any, dict[int, TokenTable]] = (
            weakref.WeakKeyDictionary()
        )
        self._grammars: OrderedDict[tuple[str, int], CompiledSchema] = OrderedDict()
        self._lock = threading.Lock()
        self.max_grammars = max_grammars
        self.threads = threads
        self.hits = 0
        self.misses = 0

    def table(self, tokenizer: Any, width: int | None = None) -> TokenTable:
        import xgrammar as xgr

        width = int(width or len(tokenizer))
        with self._lock:
            hit = self._tables.get(tokenizer, {}).get(width)
            if hit is not None:
                return hit
        stop = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else None
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=width, stop_token_ids=stop)
        decoded = list(info.decoded_vocab)
        # Special and stop tokens carry no output text (xgrammar decodes them to their names).
        special = set(info.special_token_ids) | set(info.stop_token_ids)
        special |= set(getattr(tokenizer, "all_special_ids", []))
        token_bytes = [b"" if i in special else decoded[i] for i in range(len(decoded))]
        token_bytes += [b""] * (width - len(token_bytes))
        table = TokenTable(
            info,
            xgr.GrammarCompiler(info, max_threads=self.threads),
            token_bytes,
            width,
            tuple(info.stop_token_ids),
        )
        with self._lock:
            return self._tables.setdefault(tokenizer, {}).setdefault(width, table)

    def compile(self, schema: Schema, tokenizer: Any, width: int | None = None) -> CompiledSchema:
        table = self.table(tokenizer, width)
        key = (schema.key(), table.uid)
        with self._lock:
            if key in self._grammars:
                self._grammars.move_to_end(key)
                self.hits += 1
                return self._grammars[key]
        grammar = table.compiler.compile_grammar(schema.ebnf(table.json_literal))
        compiled = CompiledSchema(schema, grammar, table)
        with self._lock:
            self.misses += 1
            self._grammars[key] = compiled
            while len(self._grammars) > self.max_grammars:
                self._grammars.popitem(last=False)
        return compiled


GRAMMARS = GrammarCache()


def compile_schema(schema: Schema, tokenizer: Any, width: int | None = None) -> CompiledSchema:
    """Compile ``schema`` for ``tokenizer`` (cached); ``width`` is the logits width."""
    return GRAMMARS.compile(schema, tokenizer, width)
