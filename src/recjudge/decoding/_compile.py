"""Compile schemas once per (schema, tokenizer) with xgrammar; token byte tables."""

from __future__ import annotations

import itertools
import json
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from recjudge._util import CacheDirError, atomic_dir, cache_dir, imports_paused, stable_hash
from recjudge.decoding._schemas import Schema, json_literal
from recjudge.llm import VOCAB_FILES, file_stamps, transformers_tokenizer_of

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
        width = int(width or len(tokenizer))
        with self._lock:
            hit = self._tables.get(tokenizer, {}).get(width)
            if hit is not None:
                return hit
        with imports_paused():  # the first table imports xgrammar (and transformers' package)
            import xgrammar as xgr

        stop = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else None
        key = _table_key(tokenizer, width, stop)
        got = _read_table(key) if key is not None else None
        if got is not None and len(got[1]) == width:
            info, token_bytes = got
        else:
            # xgrammar reads transformers' tokenizer internals: a native tokenizer's twin
            # (built once per tokenizer and machine: the table is cached below)
            info = xgr.TokenizerInfo.from_huggingface(transformers_tokenizer_of(tokenizer),
                                                      vocab_size=width,
                                                      stop_token_ids=stop)  # fmt: skip
            decoded = list(info.decoded_vocab)
            # Special and stop tokens carry no output text (xgrammar decodes them to their
            # names).
            special = set(info.special_token_ids) | set(info.stop_token_ids)
            special |= set(getattr(tokenizer, "all_special_ids", []))
            token_bytes = [b"" if i in special else decoded[i] for i in range(len(decoded))]
            token_bytes += [b""] * (width - len(token_bytes))
            if key is not None:
                _write_table(key, info, token_bytes)
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

#: bump when what a cached token table holds changes
TABLE_VERSION = 1


def _table_key(tokenizer: Any, width: int, stop: list[int] | None) -> str | None:
    """The disk cache key of a tokenizer's table, or None where it cannot be fingerprinted
    cheaply (a tokenizer not loaded from a local folder). A token table takes 0.3 s for
    SmolLM2 and 1.8 s for Qwen2.5's 151,936 tokens, in every process (most of it
    xgrammar's vocabulary decoding); the cache makes a cold judgment pay it once per
    tokenizer. The key covers the folder's tokenizer files (size and modification time),
    the tokenizer's length and special ids (tokens added in memory change it), the logits
    width, the stop ids and the xgrammar version."""
    import xgrammar as xgr

    folder = Path(str(getattr(tokenizer, "name_or_path", "") or ""))
    if not str(folder) or not folder.is_dir():
        return None
    files = file_stamps(folder, VOCAB_FILES)
    if not files:
        return None

    special = sorted(int(i) for i in getattr(tokenizer, "all_special_ids", []))
    return stable_hash(TABLE_VERSION, str(folder.resolve()), files, len(tokenizer), special,
                       width, stop, getattr(xgr, "__version__", "?"), length=32)  # fmt: skip


def _table_folder(key: str) -> Any:
    return cache_dir() / "token-tables" / key


def _read_table(key: str) -> tuple[Any, list[bytes]] | None:
    """A cached ``(TokenizerInfo, token bytes)``, or None (absent, unreadable or not the
    expected shape: then the table is built anew)."""
    import xgrammar as xgr

    try:
        folder = _table_folder(key)
        info = xgr.TokenizerInfo.deserialize_json((folder / "info.json").read_text())
        lens = np.load(folder / "lengths.npy", allow_pickle=False)
        blob = (folder / "bytes.bin").read_bytes()
    except (OSError, ValueError, RuntimeError, AttributeError, CacheDirError):
        return None  # AttributeError: an xgrammar without (de)serialization
    if lens.ndim != 1 or lens.dtype.kind not in "iu" or int(lens.sum()) != len(blob):
        return None
    ends = np.cumsum(lens).tolist()
    starts = [0, *ends[:-1]]
    return info, [blob[a:b] for a, b in zip(starts, ends, strict=True)]


def _write_table(key: str, info: Any, token_bytes: list[bytes]) -> None:
    """Write the table's parts in a temporary folder renamed into place (``atomic_dir``:
    readers never see a half-written table, a damaged one is replaced); a cache that
    cannot be written (or an xgrammar without serialization) is skipped."""
    try:
        with atomic_dir(_table_folder(key)) as tmp:
            (tmp / "info.json").write_text(info.serialize_json(), encoding="utf-8")
            np.save(tmp / "lengths.npy", np.array([len(b) for b in token_bytes], dtype=np.int32))
            (tmp / "bytes.bin").write_bytes(b"".join(token_bytes))
    except (OSError, AttributeError, CacheDirError):
        return  # another process won the rename, a read-only cache, an old xgrammar


def compile_schema(schema: Schema, tokenizer: Any, width: int | None = None) -> CompiledSchema:
    """Compile ``schema`` for ``tokenizer`` (cached); ``width`` is the logits width."""
    return GRAMMARS.compile(schema, tokenizer, width)
