"""The LLM protocol the reward core uses, and its transformers implementation.

The protocol is deliberately small: a tokenizer, chat rendering, a batched forward that
returns next-token logits, and generation with a list of logits processors. A vLLM backend can
satisfy the same protocol (see ``make_backend``'s ``backend`` argument).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from recjudge._util import RunFault, UserFacingError, first_line
from recjudge.llm._config import (
    Capabilities,
    DeviceError,
    Generation,
    LLMConfig,
    SamplingConfig,
)
from recjudge.llm._job import EngineJob
from recjudge.llm._models import ModelLoadError, resolve_model_path

ZERO_WIDTH_SPACE = "\u200b"


@contextmanager
def _load_errors(model: str, part: str) -> Iterator[None]:
    """Turn a failure to load ``model``'s ``part`` (a folder's broken tokenizer files,
    weights transformers cannot read) into one ``ModelLoadError`` line naming the model: it
    is a fault of the whole run, not of the first request that happened to load it.
    ``RunFault``s (missing packages, a damaged cache) and interruptions pass unchanged."""
    try:
        yield
    except (RunFault, KeyboardInterrupt, MemoryError):
        raise
    except Exception as e:  # noqa: BLE001 - whatever a loader raises on bad files
        first = first_line(e, 300, empty="")
        raise ModelLoadError(
            f"model {model!r}: its {part} cannot be loaded ({type(e).__name__}: {first}); a "
            "model folder needs what transformers' save_pretrained writes (config.json, "
            "model.safetensors, tokenizer.json, tokenizer_config.json), or use a preset "
            "(`recjudge models list`)"
        ) from None


class BackendNotInstalledError(RunFault, ImportError):
    """The backend asked for (vLLM) is not installed in this environment: a fault of the
    whole run, said in one line with how to install it."""


def special_strings(tokenizer: Any) -> tuple[str, ...]:
    """The strings this tokenizer reads as one special (control) token, longest first:
    chat markers such as ``<|im_end|>``, BOS/EOS, tool and FIM markers."""
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    found = {t.content for t in decoder.values() if getattr(t, "special", False)}
    found |= set(getattr(tokenizer, "all_special_tokens", []) or [])
    return tuple(sorted((x for x in found if len(x) > 1), key=len, reverse=True))


def escape_special(tokenizer: Any, text: str) -> str:
    """``text`` with every special-token string broken by a zero-width space after its first
    character, so that untrusted text (titles, profiles, user files) is always tokenized as
    plain text and never closes a chat turn or opens a new one. Text without such strings
    is returned unchanged (so are its tokens)."""
    for special in special_strings(tokenizer):
        if special in text:
            text = text.replace(special, special[0] + ZERO_WIDTH_SPACE + special[1:])
    return text


def render_chat(tokenizer: Any, messages: Sequence[dict[str, str]]) -> str:
    """Chat messages in the model's template, ending with the assistant turn.

    Message contents are escaped (``escape_special``): only the template itself produces
    special tokens.
    """
    messages = [{**m, "content": escape_special(tokenizer, m["content"])} for m in messages]
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    # Plain fallback for base models without a template.
    body = "\n\n".join(f"{m['role'].upper()}: {m['content']}" for m in messages)
    return body + "\n\nASSISTANT: "


def require_device(device: str) -> str:
    """``device`` when torch can compute there; a CUDA device on a machine where torch sees
    no GPU is one clear ``DeviceError``."""
    import torch

    if device.startswith("cuda") and not torch.cuda.is_available():
        raise DeviceError(
            f"device {device!r} was asked for but torch sees no CUDA GPU here; use device cpu "
            "(or auto)"
        )
    return device


@contextmanager
def quiet_loading() -> Iterator[None]:
    """transformers' weight-loading progress bar off for the block (restored after)."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


class TransformersBackend:
    """A causal LM in process on CPU (or wherever torch puts it): recjudge's native forward
    for the Llama-family checkpoints it covers (``recjudge.llm._native``), transformers'
    model otherwise (``LLMConfig.implementation``).

    Args:
        config: what to load. Presets are converted to a bf16 safetensors cache on first use.
    """

    def __init__(self, config: LLMConfig | None = None) -> None:
        import torch

        # torch loads here, on first use: this module is imported at the CLI's start
        from recjudge.llm._native import load_native, native_support  # noqa: PLC0415

        self.config = config or LLMConfig()
        if self.config.num_threads:
            torch.set_num_threads(self.config.num_threads)
        t0 = time.perf_counter()
        source = resolve_model_path(self.config.model)
        kwargs: dict[str, Any] = {}
        if isinstance(source, Path) and source.suffix == ".gguf":
            kwargs["gguf_file"] = source.name
            source = source.parent
        self.dtype = self.config.resolved_dtype()
        dtype = getattr(torch, self.dtype)
        self._source, self._load_kwargs, self._twin = source, kwargs, None
        impl = self.config.implementation
        with _load_errors(self.config.model, "weights"):  # e.g. a shard index leaving it
            why = "a GGUF file" if kwargs else native_support(source)
        if impl == "native" and why is not None:
            raise UserFacingError(
                f"model {self.config.model!r} cannot run on the native forward ({why}); use "
                "implementation 'auto' or 'transformers'"
            )
        # the tokenizer runs without transformers wherever it can (``_tokenizer``), unless
        # transformers was asked for
        with _load_errors(self.config.model, "tokenizer"):
            # tokenizers and jinja2 wait for the first tokenizer (a command without a model)
            from recjudge.llm._tokenizer import load_tokenizer  # noqa: PLC0415

            tokenizer = load_tokenizer(source, native=impl != "transformers", **kwargs)
        with _load_errors(self.config.model, "weights"):
            if impl != "transformers" and why is None:
                model = load_native(Path(source), dtype)
            else:
                from transformers import AutoModelForCausalLM

                # never transformers' torch.load fallback (a pickle); GGUF files are no pickle
                safe = {} if kwargs else {"use_safetensors": True}
                with quiet_loading():  # a per-tensor bar would break into the caller's bar
                    model = AutoModelForCausalLM.from_pretrained(
                        source, dtype=dtype, **kwargs, **safe
                    )
        self._adopt(model, tokenizer, t0)

    def transformers_model(self) -> Any:
        """The model as a transformers module, for what only transformers does
        (``generate()`` with logits processors, the naive baselines of the benchmarks). A
        native model's transformers twin is loaded on first use and shares its weights."""
        # torch loads here, on first use: this module is imported at the CLI's start
        from recjudge.llm._native import NativeCausalLM  # noqa: PLC0415

        if not isinstance(self.model, NativeCausalLM):
            return self.model
        if self._twin is None:
            import torch
            from transformers import AutoModelForCausalLM

            with quiet_loading():
                twin = AutoModelForCausalLM.from_pretrained(
                    self._source, dtype=getattr(torch, self.dtype), **self._load_kwargs
                )
            # the same tensors, not a second copy (their values are the same file's)
            twin.load_state_dict(self.model.state_dict(), strict=False, assign=True)
            twin.tie_weights()
            self._twin = twin.to(self.device).eval()
        return self._twin

    @classmethod
    def from_model(cls, model: Any, tokenizer: Any, config: LLMConfig) -> TransformersBackend:
        """A backend around a model built in memory (e.g. random weights of a real
        architecture, for a speed check where the weights cannot travel). ``config.model``
        names it in keys and reports; the model is moved to ``config``'s device and keeps
        its own dtype."""
        t0 = time.perf_counter()
        self = cls.__new__(cls)
        self.config = config
        self._source, self._load_kwargs, self._twin = None, {}, None
        self.dtype = str(model.dtype).removeprefix("torch.")
        self._adopt(model, tokenizer, t0)
        return self

    def _adopt(self, model: Any, tokenizer: Any, t0: float) -> None:
        """Move ``model`` to the configured device and set up what every path reads."""

        self.tokenizer, self.model = tokenizer, model
        self.device = require_device(self.config.resolved_device())
        self.model.to(self.device)
        self.model.eval()
        # torch loads here, on first use: this module is imported at the CLI's start
        from recjudge.llm._fast import supports_fast  # noqa: PLC0415

        # Step scores and the batch-invariant engine work with any causal LM; exact option
        # scoring needs the fast engine's forward.
        self.capabilities = Capabilities(option_scoring=supports_fast(self.model),
                                         device=str(self.device))  # fmt: skip
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.tokenizer.padding_side = "left"
        self.name = self.config.model
        self.vocab_size = int(self.model.get_output_embeddings().weight.shape[0])
        self.load_seconds = time.perf_counter() - t0

    # -- text ---------------------------------------------------------------------------
    def chat_prompt(self, messages: Sequence[dict[str, str]]) -> str:
        """Render chat messages with the model's template, ending with the assistant turn."""
        return render_chat(self.tokenizer, messages)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _batch(self, prompts: Sequence[str]) -> dict[str, Any]:
        return self.tokenizer(
            list(prompts), return_tensors="pt", padding=True, add_special_tokens=False
        )

    # -- compute ------------------------------------------------------------------------
    def next_token_logits(self, prompts: Sequence[str]) -> Any:
        """fp32 logits ``[B, V]`` for the token after each prompt (left-padded batch)."""
        import torch

        enc = self._batch(prompts).to(self.model.device)
        with torch.inference_mode():
            out = self.model(**enc, logits_to_keep=1)
        return out.logits[:, -1, :].float()

    def generate(
        self,
        prompts: Sequence[str],
        processors: Sequence[Any] = (),
        sampling: SamplingConfig | None = None,
    ) -> list[Generation]:
        """Generate with ``processors`` applied in order, before temperature/top-p/top-k.

        With processors this is transformers' ``generate()`` (the processors follow its
        ``LogitsProcessor`` contract). Without, free text runs on the fast engine (prompts
        in one batch share their common prefix; see ``recjudge.llm._fast``). Greedy unless
        ``sampling.do_sample``; sampled runs are seeded by ``sampling.seed``.
        """
        import torch
        from transformers import GenerationConfig, LogitsProcessorList

        sampling = sampling or SamplingConfig()
        if not processors:
            # torch loads here, on first use: this module is imported at the CLI's start
            from recjudge.llm._fast import supports_fast  # noqa: PLC0415

            if supports_fast(self.model):
                return self._generate_fast(prompts, sampling)
        enc = self._batch(prompts).to(self.model.device)
        eos = self.tokenizer.eos_token_id
        gen_kwargs: dict[str, Any] = {
            "max_new_tokens": sampling.max_new_tokens,
            "pad_token_id": self.tokenizer.pad_token_id,
            "eos_token_id": eos,
            "do_sample": sampling.do_sample,
        }
        if sampling.do_sample:
            gen_kwargs.update(
                temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k
            )
            torch.manual_seed(sampling.seed)
        else:
            gen_kwargs.update(temperature=None, top_p=None, top_k=None)
        config = GenerationConfig(**gen_kwargs)
        with torch.inference_mode():
            out = self.transformers_model().generate(
                **enc,
                generation_config=config,
                logits_processor=LogitsProcessorList(list(processors)),
            )
        width = enc["input_ids"].shape[1]
        results = []
        special = set(self.tokenizer.all_special_ids)
        for row, mask in zip(out, enc["attention_mask"], strict=True):
            new = [int(t) for t in row[width:].tolist()]
            # Trim trailing pad/eos tokens but keep any generated content.
            while new and new[-1] in special:
                new.pop()
            text = self.tokenizer.decode(new, skip_special_tokens=True)
            results.append(Generation(text=text, token_ids=new, prompt_tokens=int(mask.sum())))
        return results

    def _generate_fast(self, prompts: Sequence[str], sampling: SamplingConfig) -> list[Generation]:
        """Free text on the fast engine, until an end-of-sequence token or the budget."""
        # torch loads here, on first use: this module is imported at the CLI's start
        from recjudge.llm._fast import decode_prompts  # noqa: PLC0415

        ids = [self.encode(p) for p in prompts]
        eos = self.model.generation_config.eos_token_id
        stops = set(eos if isinstance(eos, list) else [eos]) | {self.tokenizer.eos_token_id}
        stops.discard(None)
        last: dict[int, int] = {}

        def accept(row: int, token: int) -> None:
            last[row] = token

        job = EngineJob(lambda scores, rows: None, accept, lambda row: last.get(row) in stops,
                        sampling=sampling)  # fmt: skip
        tokens = decode_prompts(self, ids, job)
        special = set(self.tokenizer.all_special_ids)
        results = []
        for prompt, new in zip(ids, tokens, strict=True):
            while new and new[-1] in special:  # as generate(): trim trailing eos/pad
                new.pop()
            text = self.tokenizer.decode(new, skip_special_tokens=True)
            results.append(Generation(text=text, token_ids=new, prompt_tokens=len(prompt)))
        return results
