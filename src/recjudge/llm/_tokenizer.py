"""The tokenizer transformers builds, run without importing transformers.

A cold judgment on the native forward still imported transformers for its tokenizer alone:
``import transformers`` and the tokenizer class's module cost ~1.2 s of a ~15 s CLI judgment
on a 2-core CPU, and ``from_pretrained`` another ~0.3-0.7 s, against ~0.2-0.5 s for the
``tokenizers`` (Rust) library to read the same vocabulary.

The tokenizer transformers gives is not always the one ``tokenizer.json`` describes: a
tokenizer class can rebuild it (transformers 5's ``Qwen2Tokenizer`` builds its own pipeline
from the vocabulary and merges and adds an NFC normalizer the file lacks). So we never
rebuild anything ourselves: the first load of a folder goes through transformers, and what
transformers built is written to the cache (``$RECJUDGE_CACHE/tokenizers/<key>/``):
its Rust tokenizer serialized (``backend_tokenizer.to_str()``: normalizer, pre-tokenizer,
model, post-processor, decoder, added tokens, exactly as transformers runs them) and the
Python-side settings it reads (named special tokens, chat template, padding side, clean-up,
special-token splitting). Later loads read that back into ``NativeTokenizer``, which runs the
same Rust tokenizer the way transformers' ``TokenizersBackend`` does (``encode_batch``,
``decode``, the same special-token bookkeeping) and renders chat templates in the same sandboxed
Jinja environment. The key covers the folder's tokenizer files (size and modification time)
and the transformers and tokenizers versions, so an upgrade or an edited file rebuilds it.

Only tokenizers transformers runs through ``TokenizersBackend``'s own methods are cached (a
class that overrides encoding or decoding in Python, a GGUF file, a Hub id load through
transformers as before). What ``NativeTokenizer`` does not do itself (tokenized chat
templates, tools, truncation, ...) it hands to the transformers tokenizer, loaded on first
use (``transformers_tokenizer()``): the same answers, at the old cost.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from recjudge._util import CacheDirError, atomic_dir, cache_dir, json_loads, stable_hash

log = logging.getLogger(__name__)

#: bump when what a cached tokenizer holds changes (2: the digest covers the entry's key)
TOKENIZER_CACHE_VERSION = 2
#: the files a tokenizer folder reads its vocabulary and special tokens from (what xgrammar's
#: token table is keyed on: a chat template does not change it)
VOCAB_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
               "added_tokens.json", "vocab.json", "merges.txt", "tokenizer.model")  # fmt: skip
#: the files a tokenizer folder may read its tokenizer from (the cache key covers them)
TOKENIZER_FILES = (*VOCAB_FILES, "chat_template.jinja", "chat_template.json")
#: ``TokenizersBackend`` methods ``NativeTokenizer`` reproduces: a class that overrides one of
#: them does something of its own in Python, and is left to transformers
_MIRRORED = ("__call__", "_encode_plus", "encode", "decode", "_decode", "batch_decode",
             "convert_tokens_to_ids", "_convert_token_to_id_with_added_voc",
             "convert_ids_to_tokens", "_convert_id_to_token", "apply_chat_template",
             "get_vocab", "__len__", "added_tokens_decoder")  # fmt: skip
#: message fields transformers copies into one another before rendering (reasoning aliases)
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


@dataclass(frozen=True)
class TokenizerSpec:
    """What transformers built for a tokenizer folder: its Rust tokenizer serialized and the
    settings transformers' Python side reads."""

    backend: str
    meta: dict[str, Any]


class Encoded(dict):
    """Token ids (and attention masks) by name, like transformers' ``BatchEncoding``:
    ``enc["input_ids"]``, ``enc.input_ids``, ``enc.to(device)`` for tensors."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def to(self, device: Any) -> Encoded:
        """Tensors moved to ``device`` in place (as ``BatchEncoding.to``); returns itself."""
        for k, v in self.items():
            if hasattr(v, "to"):
                self[k] = v.to(device)
        return self


def _clean(value: Any) -> Any:
    """Plain JSON data for a template (transformers' ``_plain_template_data`` for the types a
    chat message of strings holds); ``None`` when the value is anything else."""
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        out = {}
        for k, v in value.items():
            c = _clean(v)
            if c is None:
                return None
            out[str.__str__(k)] = c
        return out
    return None


def _template_env() -> Any:
    """Jinja's immutable sandbox as transformers sets it up for chat templates (``trim_blocks``,
    ``lstrip_blocks``, loop controls; ``tojson`` without HTML escaping; ``raise_exception``,
    ``strftime_now``; a ``dict`` and a ``namespace`` that refuse underscore names). Chat
    templates are untrusted code: the sandbox, not the template, decides what they can reach."""

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
               sort_keys: bool = False) -> str:  # fmt: skip
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)  # fmt: skip

    def strftime_now(fmt: str) -> str:
        return datetime.now().strftime(fmt)

    class TemplateDict:
        def __call__(self, *args: Any, **kwargs: Any) -> dict:
            return dict(*args, **kwargs)

        def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        def __init__(*args: Any, **kwargs: Any) -> None:
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name: str, value: Any) -> None:
            TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check_name(name: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    "Chat templates cannot store underscore-prefixed attributes on a namespace, "
                    f"but got {name!r}. Please rename the attribute."
                )

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])  # fmt: skip
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    return env


class NativeTokenizer:
    """A transformers tokenizer's behaviour on its own Rust tokenizer (see the module).

    The attributes and methods the toolkit uses are its own: calling it on a text or a batch
    (``add_special_tokens``, ``padding``, ``return_tensors="pt"``), ``encode``, ``decode``,
    ``batch_decode``, the named special tokens and their ids (settable, as transformers'),
    ``all_special_tokens`` / ``all_special_ids``, ``added_tokens_decoder``, ``get_vocab``,
    ``len()``, ``padding_side``, ``chat_template`` and ``apply_chat_template(...,
    tokenize=False)``. Anything else is the transformers tokenizer's
    (``transformers_tokenizer()``, loaded on first use, given this one's special tokens and
    padding side).

    Args:
        spec: what transformers built (``describe_tokenizer``).
        source: the folder it was built from (for the transformers twin).
        twin: the transformers tokenizer itself, when it is already loaded.
    """

    def __init__(self, spec: TokenizerSpec, source: Path | str, twin: Any = None) -> None:
        meta = spec.meta
        tk = Tokenizer.from_str(spec.backend)
        # transformers turns both off for a call that asks for neither
        tk.no_padding()
        tk.no_truncation()
        tk.encode_special_tokens = bool(meta["split_special_tokens"])
        d = self.__dict__
        d["_tk"], d["_twin"], d["_source"] = tk, twin, Path(str(source))
        d["_attributes"] = tuple(meta["special_attributes"])
        d["_special"] = dict(meta["special_tokens"])  # attribute -> token (or None)
        d["_extra"] = tuple(meta["extra_special_tokens"])
        d["_template"] = None
        d["name_or_path"] = meta["name_or_path"]
        d["chat_template"] = meta["chat_template"]
        d["padding_side"] = meta["padding_side"]
        d["clean_up_tokenization_spaces"] = bool(meta["clean_up_tokenization_spaces"])
        d["model_max_length"] = meta["model_max_length"]

    # -- special tokens -----------------------------------------------------------------
    def __setattr__(self, name: str, value: Any) -> None:
        if name.endswith("_token_id") and name[:-3] in self._attributes:
            # by id, as transformers allows: the token of that id
            token = None if value is None else self._tk.id_to_token(int(value))
            if value is not None and token is None:
                raise ValueError(f"{name} {value!r} is not an id of this tokenizer")
            name, value = name[:-3], token
        if name.endswith("_token") and name in self._attributes:
            token = None if value is None else str(value)
            if token is not None and self._tk.token_to_id(token) is None:
                raise ValueError(
                    f"{name} {token!r} is not in this tokenizer's vocabulary; set it on "
                    "transformers_tokenizer() to add a token"
                )
            self._special[name] = token
            if self._twin is not None:
                setattr(self._twin, name, value)
            return
        self.__dict__[name] = value
        if name == "chat_template":  # compiled again on next use
            self.__dict__["_template"] = None
        if name in ("padding_side", "chat_template") and self._twin is not None:
            setattr(self._twin, name, value)

    def __getattr__(self, name: str) -> Any:
        """Named special tokens (``eos_token``) and their ids (``eos_token_id``); any other
        public name is the transformers tokenizer's."""
        d = self.__dict__
        attributes = d.get("_attributes", ())
        if name in attributes:
            return d["_special"].get(name)
        if name.endswith("_id") and name[:-3] in attributes:
            token = d["_special"].get(name[:-3])
            return None if token is None else self.convert_tokens_to_ids(token)
        if name.startswith("_") or "_tk" not in d:
            raise AttributeError(name)
        return getattr(self.transformers_tokenizer(), name)

    @property
    def special_tokens_map(self) -> dict[str, str]:
        return {a: self._special[a] for a in self._attributes if self._special.get(a) is not None}

    @property
    def all_special_tokens(self) -> list[str]:
        """The named special tokens, then the extra ones, each once (transformers' order)."""
        seen: dict[str, None] = {}
        for a in self._attributes:
            if self._special.get(a) is not None:
                seen.setdefault(self._special[a], None)
        for t in self._extra:
            seen.setdefault(t, None)
        return list(seen)

    @property
    def all_special_ids(self) -> list[int]:
        return self.convert_tokens_to_ids(self.all_special_tokens)

    @property
    def added_tokens_decoder(self) -> dict[int, Any]:
        return self._tk.get_added_tokens_decoder()

    @property
    def backend_tokenizer(self) -> Any:
        return self._tk

    @property
    def vocab_size(self) -> int:
        return self._tk.get_vocab_size(with_added_tokens=False)

    def __len__(self) -> int:
        return self._tk.get_vocab_size(with_added_tokens=True)

    def get_vocab(self) -> dict[str, int]:
        return self._tk.get_vocab(with_added_tokens=True)

    def convert_tokens_to_ids(self, tokens: str | Sequence[str]) -> Any:
        """A token's id (the unknown token's id, or None, for a token not in the vocabulary)."""
        if isinstance(tokens, str):
            got = self._tk.token_to_id(tokens)
            if got is None:
                unk = self._special.get("unk_token")
                return None if unk is None else self._tk.token_to_id(unk)
            return got
        return [self.convert_tokens_to_ids(t) for t in tokens]

    def convert_ids_to_tokens(self, ids: int | Sequence[int], skip_special_tokens: bool = False):
        if isinstance(ids, int):
            return self._tk.id_to_token(ids)
        special = set(self.all_special_ids) if skip_special_tokens else set()
        return [self._tk.id_to_token(int(i)) for i in ids if int(i) not in special]

    # -- encoding -----------------------------------------------------------------------
    def __call__(
        self,
        text: str | Sequence[str],
        add_special_tokens: bool = True,
        padding: bool | str = False,
        return_tensors: str | None = None,
        return_attention_mask: bool | None = None,
        **kwargs: Any,
    ) -> Encoded:
        """Token ids of a text (flat lists) or a batch (one list per text): transformers'
        call for these arguments (others go to ``transformers_tokenizer()``)."""
        if (
            kwargs
            or padding not in (False, True, "longest", "do_not_pad")
            or (return_tensors not in (None, "pt"))
        ):
            return self.transformers_tokenizer()(
                text, add_special_tokens=add_special_tokens, padding=padding,
                return_tensors=return_tensors, return_attention_mask=return_attention_mask,
                **kwargs,
            )  # fmt: skip
        batched = isinstance(text, (list, tuple))
        texts = list(text) if batched else [text]
        if not all(isinstance(t, str) for t in texts):
            raise ValueError("text input must be of type `str` or a list of `str`")
        ids = [e.ids for e in self._tk.encode_batch(texts, add_special_tokens=add_special_tokens)]
        masks = [[1] * len(x) for x in ids]
        if padding in (True, "longest") and ids:
            width = max(len(x) for x in ids)
            pad = self.pad_token_id
            if pad is None and any(len(x) < width for x in ids):
                raise ValueError("this tokenizer has no pad token; set pad_token first")
            left = self.padding_side == "left"
            for i, x in enumerate(ids):
                fill = width - len(x)
                if fill:
                    ids[i] = [pad] * fill + x if left else x + [pad] * fill
                    masks[i] = [0] * fill + masks[i] if left else masks[i] + [0] * fill
        out = Encoded(input_ids=ids)
        if return_attention_mask is not False:
            out["attention_mask"] = masks
        if return_tensors == "pt":
            import torch

            if len({len(x) for x in ids}) > 1:
                raise ValueError(
                    "Unable to create tensor: the texts have different lengths; pass padding=True"
                )
            # on the CPU, as transformers' tokenizers return them (callers move them)
            cpu = torch.device("cpu")
            return Encoded({k: torch.tensor(v, dtype=torch.long, device=cpu)
                            for k, v in out.items()})  # fmt: skip
        if not batched:
            return Encoded({k: v[0] for k, v in out.items()})
        return out

    def encode(
        self, text: str, text_pair: Any = None, add_special_tokens: bool = True, **kwargs: Any
    ) -> list[int]:
        """Token ids of ``text`` (transformers' signature; a pair or other options go to
        ``transformers_tokenizer()``)."""
        if kwargs or text_pair is not None:
            return self.transformers_tokenizer().encode(
                text, text_pair=text_pair, add_special_tokens=add_special_tokens, **kwargs
            )
        return self(text, add_special_tokens=add_special_tokens)["input_ids"]

    def decode(
        self,
        token_ids: Any,
        skip_special_tokens: bool = False,
        clean_up_tokenization_spaces: bool | None = None,
        **kwargs: Any,
    ) -> str:
        """The text of ``token_ids`` (an id, a list, a 1-D tensor or an encoding)."""
        clean = (self.clean_up_tokenization_spaces if clean_up_tokenization_spaces is None
                 else clean_up_tokenization_spaces)  # fmt: skip
        if clean or kwargs:  # transformers' clean-up rules (and warnings) are its own
            return self.transformers_tokenizer().decode(
                token_ids, skip_special_tokens=skip_special_tokens,
                clean_up_tokenization_spaces=clean_up_tokenization_spaces, **kwargs,
            )  # fmt: skip
        if isinstance(token_ids, dict):
            token_ids = token_ids["input_ids"]
        if hasattr(token_ids, "tolist"):
            token_ids = token_ids.tolist()
        if isinstance(token_ids, int):
            token_ids = [token_ids]
        return self._tk.decode([int(t) for t in token_ids], skip_special_tokens=skip_special_tokens)

    def batch_decode(self, sequences: Iterable[Any], **kwargs: Any) -> list[str]:
        if hasattr(sequences, "tolist"):
            sequences = sequences.tolist()
        return [self.decode(s, **kwargs) for s in sequences]

    # -- chat ---------------------------------------------------------------------------
    def apply_chat_template(
        self,
        conversation: Sequence[dict[str, str]],
        tokenize: bool = True,
        add_generation_prompt: bool = False,
        **kwargs: Any,
    ) -> Any:
        """The conversation in the chat template, rendered as transformers renders it (the
        same sandbox and variables: ``messages``, ``tools=None``, ``documents=None``,
        ``add_generation_prompt`` and the named special tokens). A conversation of string
        fields rendered to text is done here; anything else (tokenized output, tools,
        documents, batches, rich content) by ``transformers_tokenizer()``."""
        messages = None
        if not tokenize and not kwargs and isinstance(conversation, (list, tuple)):
            messages = [_clean({k: v for k, v in m.items() if v is not None})
                        if isinstance(m, dict) else None for m in conversation]  # fmt: skip
            if any(m is None or any(f in m for f in _REASONING_FIELDS) for m in messages):
                messages = None
        template = self._compiled() if messages else None
        if template is None:  # (None too for a template that is not one string)
            return self.transformers_tokenizer().apply_chat_template(
                conversation, tokenize=tokenize, add_generation_prompt=add_generation_prompt,
                **kwargs,
            )  # fmt: skip
        return template.render(messages=messages, tools=None, documents=None,
                               add_generation_prompt=add_generation_prompt,
                               **self.special_tokens_map)  # fmt: skip

    def _compiled(self) -> Any:
        """The chat template compiled (once), or None when transformers must render it (no
        template, or one using transformers' own ``{% generation %}`` tag)."""
        if self._template is None:
            template: Any = False
            if isinstance(self.chat_template, str):
                try:
                    template = _template_env().from_string(self.chat_template)
                except jinja2.TemplateSyntaxError:
                    template = False
            self.__dict__["_template"] = template
        return self._template or None

    # -- transformers ---------------------------------------------------------------------
    def transformers_tokenizer(self) -> Any:
        """The transformers tokenizer this one was built from (loaded on first use, with
        this one's named special tokens and padding side)."""
        if self._twin is None:
            twin = load_transformers_tokenizer(self._source)
            for a in self._attributes:
                if getattr(twin, a, None) != self._special.get(a):
                    setattr(twin, a, self._special.get(a))
            twin.padding_side = self.padding_side
            self.__dict__["_twin"] = twin
        return self._twin

    def __repr__(self) -> str:
        return f"NativeTokenizer(name_or_path={self.name_or_path!r}, len={len(self)})"


def load_transformers_tokenizer(source: Any, **kwargs: Any) -> Any:
    """The tokenizer transformers' ``AutoTokenizer`` would load, without loading the model's
    config (which imports its modelling code): a local folder whose
    ``tokenizer_config.json`` names its tokenizer class loads that class directly;
    anything else goes through ``AutoTokenizer``."""
    folder = Path(str(source))
    tk = folder / "tokenizer_config.json"
    if not kwargs and folder.is_dir() and tk.is_file():
        try:
            name = json_loads(tk.read_text(encoding="utf-8")).get("tokenizer_class")
        except (OSError, ValueError):
            name = None
        if isinstance(name, str) and name:
            from transformers.models.auto.tokenization_auto import tokenizer_class_from_name

            cls = tokenizer_class_from_name(name)
            if cls is None and not name.endswith("Fast"):
                cls = tokenizer_class_from_name(name + "Fast")
            if cls is not None:
                return cls.from_pretrained(folder)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(source, **kwargs)


def describe_tokenizer(tok: Any) -> TokenizerSpec | None:
    """What ``NativeTokenizer`` needs from a transformers tokenizer, or None when it does
    something ``NativeTokenizer`` does not reproduce (not a Rust-backed tokenizer, a class
    that overrides encoding or decoding, several named chat templates)."""
    from transformers import PreTrainedTokenizerFast

    if not isinstance(tok, PreTrainedTokenizerFast):
        return None
    base = PreTrainedTokenizerFast
    for name in _MIRRORED:
        mine = getattr(type(tok), name, None)
        if mine is not getattr(base, name, None):
            return None
    template = getattr(tok, "chat_template", None)
    if template is not None and not isinstance(template, str):
        return None
    attributes = [str(a) for a in tok.SPECIAL_TOKENS_ATTRIBUTES]
    special = {a: (None if getattr(tok, a, None) is None else str(getattr(tok, a)))
               for a in attributes}  # fmt: skip
    extra = [str(t) for t in (getattr(tok, "extra_special_tokens", None) or [])]
    if set(tok.all_special_tokens) != set(special.values()) - {None} | set(extra):
        return None  # special tokens kept somewhere this description does not look
    max_len = getattr(tok, "model_max_length", None)
    meta = {
        "name_or_path": str(tok.name_or_path),
        "special_attributes": attributes,
        "special_tokens": special,
        "extra_special_tokens": extra,
        "chat_template": template,
        "padding_side": str(tok.padding_side),
        "clean_up_tokenization_spaces": bool(getattr(tok, "clean_up_tokenization_spaces", False)),
        "split_special_tokens": bool(getattr(tok, "split_special_tokens", False)),
        "model_max_length": int(max_len) if isinstance(max_len, int) else None,
    }
    return TokenizerSpec(tok.backend_tokenizer.to_str(), meta)


def file_stamps(folder: Path, names: Iterable[str]) -> list[tuple[str, int, int]]:
    """``(name, size, mtime_ns)`` of each of ``names`` that exists in ``folder``: what the
    tokenizer caches key on (an edited or replaced file changes it)."""
    stamps = []
    for name in names:
        try:
            st = os.stat(folder / name)
        except OSError:
            continue
        stamps.append((name, st.st_size, st.st_mtime_ns))
    return stamps


def tokenizer_key(folder: Path) -> str | None:
    """The cache key of ``folder``'s tokenizer, or None (no tokenizer files)."""
    files = file_stamps(folder, TOKENIZER_FILES)
    if not any(name == "tokenizer.json" for name, *_ in files):
        return None
    try:
        versions = [version("transformers"), version("tokenizers")]
    except PackageNotFoundError:
        return None
    return stable_hash(TOKENIZER_CACHE_VERSION, str(folder.resolve()), files, versions,
                       length=32)  # fmt: skip


def _cache_folder(key: str) -> Path:
    return cache_dir() / "tokenizers" / key


def read_tokenizer_spec(key: str) -> TokenizerSpec | None:
    """A cached description, or None (absent, unreadable, or not one this version wrote)."""
    try:
        folder = _cache_folder(key)
        meta = json_loads((folder / "meta.json").read_text(encoding="utf-8"))
        backend = (folder / "backend.json").read_text(encoding="utf-8")
    except (OSError, ValueError, CacheDirError):
        return None
    need = {"name_or_path", "special_attributes", "special_tokens", "extra_special_tokens",
            "chat_template", "padding_side", "clean_up_tokenization_spaces",
            "split_special_tokens", "model_max_length", "version"}  # fmt: skip
    if not isinstance(meta, dict) or not need <= set(meta):
        return None
    if meta["version"] != TOKENIZER_CACHE_VERSION:
        return None
    if meta.get("content_sha256") != _spec_digest(backend, meta, key):
        # Edited or damaged since it was written (two ids swapped, a chat template with a
        # line added), another tokenizer's entry copied in (its digest is of its own key),
        # or written before digests: rebuilt from the model's own files.
        log.warning("tokenizer cache %s does not match its recorded digest; rebuilding it",
                    folder)  # fmt: skip
        return None
    return TokenizerSpec(backend, meta)


def _spec_digest(backend: str, meta: dict[str, Any], key: str) -> str:
    """sha256 over the entry's key (the model files it was built from, ``tokenizer_key``),
    the serialized tokenizer and its description (the digest itself aside): recorded when
    the cache entry is written, checked at every read (~10 ms for Qwen2.5's 11 MB
    tokenizer). The key makes an entry valid only where it was written: a whole entry of
    another tokenizer moved into this one's folder is self-consistent but fails here."""
    body = {k: v for k, v in meta.items() if k != "content_sha256"}
    h = hashlib.sha256(key.encode("utf-8") + b"\n")
    h.update(backend.encode("utf-8"))
    h.update(b"\n" + json.dumps(body, sort_keys=True, default=str).encode("utf-8"))
    return h.hexdigest()


def write_tokenizer_spec(key: str, spec: TokenizerSpec) -> None:
    """Cache ``spec`` (atomically; a cache that cannot be written is skipped)."""
    try:
        with atomic_dir(_cache_folder(key)) as tmp:
            (tmp / "backend.json").write_text(spec.backend, encoding="utf-8")
            meta = {**spec.meta, "version": TOKENIZER_CACHE_VERSION}
            meta["content_sha256"] = _spec_digest(spec.backend, meta, key)
            (tmp / "meta.json").write_text(json.dumps(meta, indent=1), encoding="utf-8")
    except (OSError, CacheDirError):
        return


def load_tokenizer(source: Any, *, native: bool = True, **kwargs: Any) -> Any:
    """The tokenizer of ``source``: a ``NativeTokenizer`` for a local folder whose tokenizer
    it reproduces (built through transformers the first time, from the cache after), the
    transformers tokenizer otherwise (``native=False``, a GGUF file's ``kwargs``, a Hub id,
    a tokenizer class of its own)."""
    folder = Path(str(source))
    key = tokenizer_key(folder) if native and not kwargs and folder.is_dir() else None
    if key is not None:
        spec = read_tokenizer_spec(key)
        if spec is not None:
            try:
                return NativeTokenizer(spec, folder)
            except Exception:  # noqa: BLE001 - a cache another tokenizers wrote: rebuild it
                pass
    tok = load_transformers_tokenizer(source, **kwargs)
    if key is None:
        return tok
    spec = describe_tokenizer(tok)
    if spec is None:
        return tok
    write_tokenizer_spec(key, spec)
    return NativeTokenizer(spec, folder, twin=tok)


def transformers_tokenizer_of(tok: Any) -> Any:
    """The transformers tokenizer behind ``tok`` (``tok`` itself when it is one): for code
    that reads transformers' internals (xgrammar's ``TokenizerInfo.from_huggingface``)."""
    return tok.transformers_tokenizer() if isinstance(tok, NativeTokenizer) else tok


__all__ = [
    "TOKENIZER_CACHE_VERSION",
    "Encoded",
    "NativeTokenizer",
    "TokenizerSpec",
    "VOCAB_FILES",
    "describe_tokenizer",
    "file_stamps",
    "load_tokenizer",
    "load_transformers_tokenizer",
    "tokenizer_key",
    "transformers_tokenizer_of",
]
