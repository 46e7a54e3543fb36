"""The personas a user-simulator judge writes first, one per user history
(``Judge.persona``; ``judge_many`` prepares them first)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from recjudge.llm import SamplingConfig
from recjudge.reward._judge_config import JudgeConfig
from recjudge.reward._judgment import JudgeRequest
from recjudge.reward._simulators import persona_asks, persona_key
from recjudge.reward._store import ResultsStore, personas_path
from recjudge.reward._stored import generate_stored


class Personas:
    """A simulator's persona texts, kept by persona key, and the role a request is asked in.

    Args:
        simulator: the user simulator (``reward._simulators.SIMULATORS``).
        population: the dataset facts it reads (traits, user attributes).
        config: the judge's settings (model, ``max_history``, ``persona_tokens``, batch).
        llm: the judge's LLM, loaded when first called.
        llm_settings: what of the LLM changes an answer (part of the persona key).
    """

    def __init__(
        self,
        simulator: Any,
        population: Any,
        config: JudgeConfig,
        llm: Callable[[], Any],
        llm_settings: Callable[[], dict[str, Any]],
    ) -> None:
        self.simulator, self.population, self.config = simulator, population, config
        self._llm, self._llm_settings = llm, llm_settings
        self.texts: dict[str, str] = {}  # persona texts by persona key

    def _settings(self) -> dict[str, Any]:
        return {"model": self.config.model, **self._llm_settings()}

    def key(self, req: JudgeRequest) -> str:
        """The persona key of this request's user and history."""
        return persona_key(self.simulator, req, self._settings(), self.config.max_history)

    def persona(self, req: JudgeRequest) -> str:
        """The persona of this request's user (written by ``prepare`` when missing)."""
        key = self.key(req)
        if key not in self.texts:
            self.prepare([req])
        return self.texts[key]

    def role(self, req: JudgeRequest) -> dict[str, str]:
        """The simulator's system message (persona, traits, attributes) and question; part
        of the judgment key, so a changed persona or population is judged anew."""
        system = self.simulator.system(self.persona(req), req.user_id, req.history,
                                       self.population)  # fmt: skip
        return {"system": system, "question": self.simulator.question}

    def prepare(
        self, reqs: Sequence[JudgeRequest], store: ResultsStore | None = None, progress=False
    ) -> None:
        """Write (or read back from ``store``'s personas file) the persona of every distinct
        user history among ``reqs``."""
        c = self.config
        asks = persona_asks(self.simulator, reqs, self.population, self._settings(),
                            c.max_history)  # fmt: skip
        missing = [a for a in asks if a.key not in self.texts]
        if not missing:
            return
        sampling = SamplingConfig(max_new_tokens=c.persona_tokens)

        def write(personas: ResultsStore) -> None:
            got = generate_stored(
                self._llm(),
                personas,
                missing,
                sampling=sampling,
                # whole prompts, no shared prefix: 8 at a time unless told (their memory)
                batch_size=c.batch_size or 8,
                desc="personas",
                progress=progress,
            )
            self.texts.update({k: v["text"] for k, v in got.items()})

        if store is None:  # the texts are kept on this judge; the store is only the loop's
            with ResultsStore(":memory:") as personas:
                write(personas)
        else:  # next to the judgments' store, never in it (its rows are all judgments)
            with ResultsStore(personas_path(store.path)) as personas:
                write(personas)
