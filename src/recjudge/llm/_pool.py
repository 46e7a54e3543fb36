"""The models one run needs, loaded on first use and released on request."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from recjudge.llm._config import former_llm_settings_of, llm_settings_of, resolution_state
from recjudge.llm._load import load_llm
from recjudge.llm._models import check_models


class LLMPool:
    """Backends by model name for one evaluator run (an explicit object, not a global cache).

    Args:
        loaded: backends the caller already has (tests pass a shared fixture); others are
            loaded with ``load_llm`` on first ``get``.
        needed: every model the run will ``get``; those not ``loaded`` are checked now
            (``check_models``), so a missing one fails before the run starts, not hours in.
    """

    def __init__(self, loaded: Mapping[str, Any] | None = None, needed: Iterable[str] = ()) -> None:
        self._llms: dict[str, Any] = dict(loaded or {})
        #: (``llm_key``, its former forms) by (model, loaded, resolution state): resolved
        #: once per model, not per stored question (a run keys 10^4)
        self._settings: dict[tuple[Any, ...], tuple[dict[str, Any], list[dict[str, Any]]]] = {}
        check_models(n for n in needed if n not in self._llms)

    def get(self, name: str) -> Any:
        if name not in self._llms:
            self._llms[name] = load_llm(name)
        return self._llms[name]

    def _resolved(self, name: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        state = (name, name in self._llms, *resolution_state())
        if state not in self._settings:
            loaded = self._llms.get(name)
            self._settings[state] = (
                llm_settings_of(loaded, name),
                former_llm_settings_of(loaded, name),
            )
        return self._settings[state]

    def key(self, name: str) -> dict[str, Any]:
        """``llm_key`` of model ``name``: of the backend it is (or was given as), else of the
        config ``load_llm`` will load it with. Stored answers key what ran them."""
        return self._resolved(name)[0]

    def former(self, name: str) -> list[dict[str, Any]]:
        """``key``'s earlier forms for model ``name`` (``former_llm_keys``; none for most)."""
        return self._resolved(name)[1]

    def release(self, name: str) -> None:
        """Forget ``name`` (its memory is freed once nothing else holds it)."""
        self._llms.pop(name, None)
