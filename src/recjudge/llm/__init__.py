"""LLM backends behind one protocol, model presets and the weight cache.

The names that need torch (the option search, the engine's errors) are imported on first
use (PEP 562): the CLI's root options import this package for its defaults, and commands
that never compute with a model (``store``, ``data``, a command's ``--help``) would pay
torch's ~2 s import for nothing.
"""

import importlib
from typing import TYPE_CHECKING, Any

from recjudge.llm._backend import (
    TransformersBackend,
    escape_special,
    quiet_loading,
    require_device,
    special_strings,
)
from recjudge.llm._card import (
    SIGNATURE_FILE,
    TUNED_CARD,
    TUNED_FORMAT,
    USERS_FILE,
    TunedCardError,
    card_digest,
    check_tuned,
    read_card,
    sign_card,
    tuned_key,
    user_hash,
    verify_folder,
)
from recjudge.llm._config import (
    DEFAULT_FIELDS,
    DTYPE_ENV,
    ENGINE_CAPABILITIES,
    VLLM_UNKEYED_ARGS,
    BackendError,
    Capabilities,
    DeviceError,
    DtypeEnvError,
    EngineBackend,
    Generation,
    LLMBackend,
    LLMConfig,
    LocalModel,
    SamplingConfig,
    auto_dtype,
    capabilities_of,
    former_llm_keys,
    former_llm_settings_of,
    llm_key,
    llm_settings_of,
    loaded_config,
    reset_llm_defaults,
    resolution_state,
    resolve_llm_config,
    set_llm_defaults,
)
from recjudge.llm._load import BACKENDS, BackendSpec, load_llm
from recjudge.llm._models import (
    DEFAULT_MODEL,
    PRESETS,
    ModelIntegrityError,
    ModelLoadError,
    ModelNotInstalledError,
    ModelPreset,
    assemble_gguf,
    build_cache,
    check_models,
    check_weights_format,
    install_preset,
    preset_info,
    resolve_model_path,
    verify_cache,
)
from recjudge.llm._pool import LLMPool

if TYPE_CHECKING:
    from recjudge.llm._choice import BestOption, OptionTrie, best_options, option_tokens
    from recjudge.llm._engine import EngineStats, NonFiniteLogitsError
    from recjudge.llm._fast import decode_prompts, decode_shared, prefixes_of
    from recjudge.llm._job import EngineJob
    from recjudge.llm._ray_data_llm import RayDataLLM, fingerprint, run_requests
    from recjudge.llm._tokenizer import VOCAB_FILES, file_stamps, transformers_tokenizer_of
    from recjudge.llm._vllm import (
        PROCESSORS,
        SPEC_DECODE_ERROR,
        EngineRequest,
        EngineResult,
        ServerError,
        model_source,
        serve_command,
    )

#: public name -> the private module that defines it, imported when the name is first read
_LAZY = {
    "BestOption": "_choice",
    "OptionTrie": "_choice",
    "best_options": "_choice",
    "option_tokens": "_choice",
    "NonFiniteLogitsError": "_engine",
    # what decoding, the judge and the benches use from the engines (torch; vLLM clients)
    "EngineStats": "_engine",
    "EngineJob": "_job",
    "fingerprint": "_ray_data_llm",
    "RayDataLLM": "_ray_data_llm",
    "run_requests": "_ray_data_llm",
    "decode_prompts": "_fast",
    "decode_shared": "_fast",
    "prefixes_of": "_fast",
    "EngineRequest": "_vllm",
    "EngineResult": "_vllm",
    "ServerError": "_vllm",
    "PROCESSORS": "_vllm",
    "SPEC_DECODE_ERROR": "_vllm",
    "model_source": "_vllm",
    "serve_command": "_vllm",
    "VOCAB_FILES": "_tokenizer",
    "file_stamps": "_tokenizer",
    "transformers_tokenizer_of": "_tokenizer",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

    value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    globals()[name] = value  # later reads skip this hook
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "quiet_loading",
    "SIGNATURE_FILE",
    "TUNED_CARD",
    "TUNED_FORMAT",
    "USERS_FILE",
    "TunedCardError",
    "card_digest",
    "check_tuned",
    "read_card",
    "sign_card",
    "tuned_key",
    "user_hash",
    "verify_folder",
    "EngineBackend",
    "LocalModel",
    "EngineStats",
    "EngineJob",
    "fingerprint",
    "RayDataLLM",
    "run_requests",
    "decode_prompts",
    "decode_shared",
    "prefixes_of",
    "EngineRequest",
    "EngineResult",
    "ServerError",
    "PROCESSORS",
    "SPEC_DECODE_ERROR",
    "model_source",
    "serve_command",
    "VOCAB_FILES",
    "file_stamps",
    "transformers_tokenizer_of",
    "require_device",
    "DTYPE_ENV",
    "DEFAULT_FIELDS",
    "ENGINE_CAPABILITIES",
    "BackendError",
    "DeviceError",
    "Capabilities",
    "capabilities_of",
    "DtypeEnvError",
    "auto_dtype",
    "LLMPool",
    "BestOption",
    "OptionTrie",
    "best_options",
    "option_tokens",
    "DEFAULT_MODEL",
    "PRESETS",
    "Generation",
    "LLMBackend",
    "LLMConfig",
    "ModelIntegrityError",
    "ModelLoadError",
    "ModelNotInstalledError",
    "ModelPreset",
    "NonFiniteLogitsError",
    "SamplingConfig",
    "TransformersBackend",
    "assemble_gguf",
    "build_cache",
    "check_models",
    "check_weights_format",
    "escape_special",
    "install_preset",
    "load_llm",
    "BACKENDS",
    "BackendSpec",
    "reset_llm_defaults",
    "resolve_llm_config",
    "llm_key",
    "former_llm_keys",
    "former_llm_settings_of",
    "llm_settings_of",
    "loaded_config",
    "resolution_state",
    "VLLM_UNKEYED_ARGS",
    "set_llm_defaults",
    "preset_info",
    "resolve_model_path",
    "special_strings",
    "verify_cache",
]
