"""LLM backends behind one protocol, model presets and the weight cache."""

from recjudge.llm._backend import (
    DTYPE_ENV,
    DtypeEnvError,
    Generation,
    LLMBackend,
    LLMConfig,
    SamplingConfig,
    TransformersBackend,
    auto_dtype,
    escape_special,
    load_llm,
    special_strings,
)
from recjudge.llm._choice import BestOption, OptionTrie, best_options, option_tokens
from recjudge.llm._engine import NonFiniteLogitsError
from recjudge.llm._models import (
    DEFAULT_MODEL,
    PRESETS,
    ModelIntegrityError,
    ModelNotInstalledError,
    ModelPreset,
    assemble_gguf,
    build_cache,
    check_models,
    install_preset,
    preset_info,
    resolve_model_path,
    verify_cache,
)
from recjudge.llm._pool import LLMPool

__all__ = [
    "DTYPE_ENV",
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
    "ModelNotInstalledError",
    "ModelPreset",
    "NonFiniteLogitsError",
    "SamplingConfig",
    "TransformersBackend",
    "assemble_gguf",
    "build_cache",
    "check_models",
    "escape_special",
    "install_preset",
    "load_llm",
    "preset_info",
    "resolve_model_path",
    "special_strings",
    "verify_cache",
]
