"""What every LLM backend and engine shares, with no backend in it: dtype and sampling
settings, the load config, ``Generation``, the declared ``Capabilities`` and the ``LLMBackend``
Protocol. The backends (``_backend``, ``_vllm``) and the engines (``_fast``, ``_engine``)
import it; it imports none of them, so no import cycle runs through the layer.
"""

from __future__ import annotations

import contextvars
import inspect
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

from recjudge._util import RunFault, native_bf16, redact_uri
from recjudge.llm._card import tuned_key
from recjudge.llm._models import DEFAULT_MODEL

DTYPE_ENV = "RECJUDGE_DTYPE"
DTYPES = ("bfloat16", "float32", "float16")


class DeviceError(RunFault, RuntimeError):
    """A device was asked for that this machine does not have."""


class DtypeEnvError(RunFault, ValueError):
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

    # Every field is classified (tests/evaluators/test_store_keys.py): the budget and the
    # choice to sample always change an answer; the warpers and the seed only when sampling.
    KEYED: ClassVar[frozenset[str]] = frozenset({"do_sample", "max_new_tokens"})
    UNKEYED: ClassVar[frozenset[str]] = frozenset()
    KEYED_WHEN: ClassVar[dict[str, str]] = {
        "temperature": "do_sample", "top_p": "do_sample", "top_k": "do_sample", "seed": "do_sample"
    }  # fmt: skip

    def key(self) -> dict[str, Any]:
        """The settings that change a result: the one form every result key holds (the
        judge's judgments and every evaluator's stored questions).

        Greedy decoding ignores the warpers and the seed, so they enter a greedy key at their
        defaults: two greedy configs with one budget share every stored answer. That is the
        form judgments were always keyed under (whole settings, defaults), so their keys
        stay; the evaluators' greedy keys held ``former_key()`` until 2026-12-02 and are
        re-keyed on first use (``StoredAsk.formerly``).
        """
        if not self.do_sample:
            return SamplingConfig(max_new_tokens=self.max_new_tokens).model_dump()
        return self.model_dump()

    def former_key(self) -> dict[str, Any]:
        """The short greedy form (budget only) the evaluators' stored questions were keyed
        under until 2026-12-02: only for finding those answers again (``key`` is the key)."""
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
        implementation: backend ``transformers``: ``auto`` (the default) runs Llama, Qwen2/3
            and Mistral checkpoints in a local folder (presets included) on recjudge's
            native forward (``recjudge.llm._native``: transformers' operations, without
            importing its modelling code, ~6 s of a cold start on a small CPU) and anything
            else on transformers; ``native`` insists (an error names what does not fit);
            ``transformers`` always loads transformers' model. Not part of result keys: the
            native forward is transformers' forward op for op (tested against it).
    """

    # hide_input_in_errors: a refused base_url may hold a password; pydantic's message would
    # otherwise repeat the input verbatim
    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

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
    implementation: Literal["auto", "native", "transformers"] = "auto"

    # Every field is classified (tests/evaluators/test_store_keys.py fails on one that is not): what
    # changes an answer is in ``llm_key`` (the model itself is keyed by each caller, beside
    # its prompt); what only changes how fast or where from it is read is not.
    KEYED: ClassVar[frozenset[str]] = frozenset(
        {"model", "dtype", "device", "backend", "vllm_args", "base_url", "served_model"}
    )
    #: ``implementation``: the native forward is transformers' forward op for op (tested);
    #: threads, concurrency and timeouts change speed; the key's variable name is no answer
    UNKEYED: ClassVar[frozenset[str]] = frozenset(
        {"num_threads", "api_key_env", "concurrency", "timeout", "probe_bias", "implementation"}
    )

    @field_validator("base_url")
    @classmethod
    def _no_credentials(cls, value: str | None) -> str | None:
        # A password in the URL would reach result keys, report headers and error lines; the
        # key goes in the environment (sent as a bearer token, never over plain http).
        if value is not None:
            try:
                parts = urlsplit(value)
                has_credentials = parts.username is not None or parts.password is not None
            except ValueError as e:
                raise ValueError(f"server URL is not a URL ({e})") from None
            if has_credentials:
                raise ValueError(
                    f"server URL {redact_uri(value)} holds credentials: give the URL without "
                    "them and put the API key in $RECJUDGE_API_KEY (or the variable api_key_env "
                    "names)"
                )
        return value

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


#: ``vllm_args`` that change only memory, scheduling or logging, never an answer: left out
#: of ``llm_key`` (anything else given to vLLM, e.g. ``quantization``, is keyed)
VLLM_UNKEYED_ARGS = frozenset({
    "gpu_memory_utilization", "swap_space", "cpu_offload_gb", "max_num_seqs",
    "max_num_batched_tokens", "disable_log_stats", "enable_chunked_prefill", "block_size",
    "max_model_len", "enforce_eager", "tensor_parallel_size", "pipeline_parallel_size",
})  # fmt: skip


def llm_key(config: LLMConfig) -> dict[str, Any]:
    """What of an LLM's settings changes its answers, for every result key (judgments,
    personas, the evaluators' stored questions): the resolved dtype (bf16 and fp32 round
    differently; ``auto`` picks by machine); ``device`` when not the CPU (a GPU's kernels
    round differently); for other engines the backend, the endpoint, the served model name
    and the ``vllm_args`` that change answers (``VLLM_UNKEYED_ARGS`` aside); a tuned model
    folder's card digest (``recjudge judge tune``, ``llm._card``). The model
    itself is left to the caller (each keys it beside its prompt). Fields at the values keys
    were made under before they were keyed (transformers on the CPU) add nothing, so those
    keys stay as they were.

    A server (``openai-compatible``) computes in its own dtype, which the client cannot
    see: its key holds a dtype only where the user states one (``dtype`` not ``auto``), not
    what ``auto`` would pick on the client's machine (until 2026-12-06 it did:
    ``former_llm_keys``).

    ``LLMConfig.KEYED`` and ``UNKEYED`` classify every field.
    """
    out: dict[str, Any] = {} if _server_auto(config) else {"dtype": config.resolved_dtype()}

    tuned = tuned_key(config.model) if config.backend != "openai-compatible" else None
    if tuned is not None:  # a folder of `judge tune`: its card (base, data, weights) is keyed
        out["tuned"] = tuned
    if config.backend == "transformers":
        if config.device != "cpu":
            device = config.resolved_device()
            if device != "cpu":
                out["device"] = device.split(":")[0]
        return out
    # another server may serve another model or build under the same name
    out.update(backend=config.backend, endpoint=config.base_url)
    if config.served_model and config.served_model != config.model:
        out["served_model"] = config.served_model
    args = {k: v for k, v in config.vllm_args.items() if k not in VLLM_UNKEYED_ARGS}
    if args and config.backend == "vllm":
        out["vllm_args"] = args
    return out


def _server_auto(config: LLMConfig) -> bool:
    """A server whose dtype the user left to ``auto`` (the client cannot see the server's)."""
    return config.backend == "openai-compatible" and config.dtype == "auto"


def former_llm_keys(config: LLMConfig) -> list[dict[str, Any]]:
    """``llm_key``'s earlier forms for ``config``, which a store may hold answers under (a
    result found under one is the same answer, adopted under today's key): until 2026-12-06 a
    server's key held the dtype ``auto`` resolves to on the client's machine."""
    if _server_auto(config):
        return [{**llm_key(config), "dtype": config.resolved_dtype()}]
    return []


def resolution_state() -> tuple[str | None, bool | None]:
    """What resolving an ``LLMConfig`` (``auto`` dtype and device) reads from the process:
    ``$RECJUDGE_DTYPE`` and whether torch sees a GPU (None before torch is imported): a
    cache of ``llm_key`` is valid while this is unchanged."""
    torch = sys.modules.get("torch")
    return os.environ.get(DTYPE_ENV), torch.cuda.is_available() if torch is not None else None


def loaded_config(llm: Any) -> LLMConfig | None:
    """The config a loaded backend runs under, with the device its ``Capabilities`` declare
    it computes on (the one reader of ``Capabilities.device``: the key names where the
    model really is, not what ``auto`` would pick now); ``None`` for ``None`` or an object
    without a config (a test double). Attributes are read without running the object's own
    ``__getattr__`` (a stand-in may refuse any use)."""

    def static(name: str) -> Any:
        try:
            return inspect.getattr_static(llm, name)
        except AttributeError:
            return None

    config = static("config") if llm is not None else None
    if not isinstance(config, LLMConfig):
        return None
    caps = static("capabilities")
    device = caps.device if isinstance(caps, Capabilities) else None
    if config.backend == "transformers" and device and re.fullmatch(r"cpu|cuda(:\d+)?", device):
        return config.model_copy(update={"device": device})
    return config


def llm_settings_of(llm: Any, model: str | LLMConfig) -> dict[str, Any]:
    """``llm_key`` of a loaded backend (``loaded_config``), or, for ``None`` or an object
    without a config (a test double), of what ``load_llm(model)`` would load."""
    config = loaded_config(llm)
    return llm_key(config if config is not None else resolve_llm_config(model))


def former_llm_settings_of(llm: Any, model: str | LLMConfig) -> list[dict[str, Any]]:
    """``former_llm_keys`` of the LLM ``llm_settings_of`` keys."""
    config = loaded_config(llm)
    return former_llm_keys(config if config is not None else resolve_llm_config(model))


#: fields of ``LLMConfig`` a command line may set for every model a command loads
#: (``recjudge --backend vllm <command>``; ``set_llm_defaults``)
DEFAULT_FIELDS = ("backend", "base_url", "device", "dtype", "vllm_args", "served_model",
                  "implementation")  # fmt: skip
_DEFAULTS: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "recjudge_llm_defaults", default=None
)


def set_llm_defaults(**fields: Any) -> contextvars.Token:
    """Settings for every LLM loaded from here on where its caller left them unset: how a
    command line runs every evaluator, job and benchmark on vLLM or a server (``recjudge
    --backend vllm run ...``, ``recjudge --server URL impute ...``) without each growing
    its own options. A field the caller set (a benchmark that pins the transformers
    backend it measures, a judge given ``--device``) keeps its value. Results stay keyed
    by the LLM that ran them (``Judge`` keys read ``resolve_llm_config``).

    Raises:
        ValueError: a field that is not one of ``DEFAULT_FIELDS``, or a bad value.
    """
    unknown = sorted(set(fields) - set(DEFAULT_FIELDS))
    if unknown:
        raise ValueError(f"not an LLM default: {', '.join(unknown)} (use {DEFAULT_FIELDS})")
    given = {k: v for k, v in fields.items() if v is not None}
    if given.get("base_url") and "backend" not in given:
        given["backend"] = "openai-compatible"  # a server URL means the server backend
    LLMConfig(**given)  # validates every value
    return _DEFAULTS.set(given)


def reset_llm_defaults(token: contextvars.Token) -> None:
    """Undo the ``set_llm_defaults`` call that returned ``token``."""
    _DEFAULTS.reset(token)


def resolve_llm_config(model: str | LLMConfig) -> LLMConfig:
    """``model`` as the ``LLMConfig`` that ``load_llm`` loads: a name becomes a config, and
    the defaults of ``set_llm_defaults`` fill the fields its caller did not set."""
    config = model if isinstance(model, LLMConfig) else LLMConfig(model=model)
    defaults = _DEFAULTS.get() or {}
    over = {k: v for k, v in defaults.items() if k not in config.model_fields_set}
    return LLMConfig(**{**config.model_dump(exclude_unset=True), **over}) if over else config


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
        option_scoring: exact whole-option likelihood (``recjudge.llm.best_options``): over
            the model's own forward passes, or (engine backends) over the engine's
            next-token log-probabilities (``next_logprobs``).
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


class BackendError(RunFault, TypeError):
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


@runtime_checkable
class LocalModel(LLMBackend, Protocol):
    """A backend whose model computes in this process (``TransformersBackend``): what the
    fast engine, whole-option scoring and the benches read besides ``LLMBackend``.

    ``prefixes``, the engine's shared-prefix cache, is created on first use
    (``recjudge.llm.prefixes_of``), so it is no member here."""

    config: LLMConfig
    model: Any  # a torch module (recjudge's native forward or transformers')
    dtype: str
    device: str


@runtime_checkable
class EngineBackend(LLMBackend, Protocol):
    """A backend whose engine applies the grammar and the branch bias itself (vLLM in
    process or a server; ``capabilities.engine_constraints``): what decoding sends it."""

    config: LLMConfig
    needs_bias_probe: bool  # check the server applies the bias before the first request

    def submit(self, requests: list[Any]) -> list[Any]: ...

    def next_logprobs(
        self, prompts: Sequence[Sequence[int]], watch: Sequence[Sequence[int]]
    ) -> list[dict[int, float]]: ...
