"""A judge's result keys (``Judge.key`` / ``Judge.decision_key``).

A key hashes everything that can change an answer: the prompt version, the judge's keyed
settings (``JudgeConfig.KEYED``) and the LLM's (``llm_key``), the CF signal, the user, the
candidate, the history and, for a user simulator, its role text."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from recjudge._util import json_part, stable_hash_encoded
from recjudge.reward._judge_config import JudgeConfig
from recjudge.reward._judgment import JudgeRequest
from recjudge.reward._prompt import PROMPT_VERSION, HistoryItem


class JudgeKeys:
    """The keys of one judge's results.

    Args:
        config: the judge's settings.
        cf_id: its CF model's identity (``cf_identity``), in the key of a request that
            carries no sigma of its own.
        llm_settings: what of the LLM changes an answer, now (a new object when it changes:
            the settings part is encoded again then).
        role: a user simulator's role text of a request (None for the judge modes).
        former_llm_settings: earlier forms of ``llm_settings`` that stored results may be
            keyed under (``llm.former_llm_keys``; ``former``).
    """

    #: histories whose key encoding is kept (a bound, not a tuning: one batch's users)
    HISTORY_MEMO = 4096

    def __init__(
        self,
        config: JudgeConfig,
        cf_id: str | None,
        llm_settings: Callable[[], dict[str, Any]],
        role: Callable[[JudgeRequest], dict[str, str]] | None = None,
        former_llm_settings: Callable[[], list[dict[str, Any]]] | None = None,
    ) -> None:
        self.config, self.cf_id = config, cf_id
        self._llm_settings, self._role = llm_settings, role
        self._former_llm = former_llm_settings or list
        self._history_memo: dict[int, tuple[list[HistoryItem], int, str]] = {}
        self._settings_memo: dict[tuple[bool, int], tuple[Any, str]] = {}

    def has_former(self) -> bool:
        """Whether the LLM's settings have earlier forms at all (``former``: none for most)."""
        return bool(self._former_llm())

    def former(self, req: JudgeRequest, bias: bool = True) -> list[str]:
        """The keys ``req``'s result (without ``bias``: its decision record) had under the
        LLM settings' earlier forms (none for most LLMs): a store holding one holds today's
        answer (``JudgePlan`` and the sweep adopt it)."""
        return [self.key(req, bias, llm=f) for f in self._former_llm()]

    def key(self, req: JudgeRequest, bias: bool = True, llm: dict[str, Any] | None = None) -> str:
        """The result key; without ``bias`` the decision key (``Judge.decision_key``);
        ``llm``: other LLM settings than the judge's (``former``).

        Raises:
            ValueError: the request carries part of its history (``older``: a worker's);
                its key is the one the driver computed from the whole history.
        """
        if req.older:
            raise ValueError(f"request ({req.user_id!r}, {req.candidate_id!r}) carries its "
                             f"history's last {len(req.history)} items only; its key is the "
                             "driver's, from the whole history")  # fmt: skip
        signal = (self.cf_id if req.sigma is None else None, req.sigma) if bias else ()
        # = stable_hash(PROMPT_VERSION, ["decision"], settings, *signal, user, candidate id
        # and text, [(item, text, rating) per history item], [role]), the settings and the
        # history encoded once (a user's candidates share a history: most of a key's cost)
        head = [PROMPT_VERSION, *([] if bias else ["decision"])]
        parts = [*signal, req.user_id, req.candidate_id, req.candidate_text]
        return stable_hash_encoded(
            [
                json_part(head)[1:-1],  # a list's items joined as the whole list joins them
                self._settings_json(bias, llm),
                json_part(parts)[1:-1],
                self._history_json(req.history),
                *([json_part(self._role(req))] if self._role is not None else []),
            ],
            length=32,
        )

    def _settings_json(self, bias: bool, llm: dict[str, Any] | None = None) -> str:
        """The key's settings part, encoded once while the LLM's settings stay (the config is
        frozen; ``llm_settings`` gives a new object when what it reads changes)."""
        llm = self._llm_settings() if llm is None else llm
        got = self._settings_memo.get((bias, id(llm)))
        if got is not None and got[0] is llm:
            return got[1]
        c = self.config
        keyed = set(c.KEYED)  # JudgeConfig classifies every field (see there)
        if c.deterministic:
            keyed.add("decode_rows")
        if self._role is not None:  # a simulator's role text is in the key too
            keyed.add("persona_tokens")
        if c.layout != "candidate-last":  # keys made before the layout existed stay
            keyed.add("layout")
        if c.marking != "plain":  # likewise
            keyed.add("marking")
        if not bias:
            keyed -= c.AFTER_DECISION
        settings = c.model_dump(include=keyed) | llm
        # The one sampling key (SamplingConfig.key): greedy ignores the warpers and the seed
        # and decodes once, so those and ``samples`` enter a greedy key at their defaults.
        settings["sampling"] = c.sampling.key()
        settings["samples"] = c.samples if c.sampling.do_sample else 1
        if "decode_rows" in keyed:  # None runs (and so keys) as the invariant engine's 8
            settings["decode_rows"] = c.rows()
        enc = json_part(settings)
        if len(self._settings_memo) >= 8:  # the LLM's settings changed since: old entries
            self._settings_memo.clear()
        self._settings_memo[(bias, id(llm))] = (llm, enc)
        return enc

    def _history_json(self, history: list[HistoryItem]) -> str:
        """The key's encoding of a history, kept per history list: requests built together
        share one list per user (``requests_for``). The list itself is held with its length,
        so an entry answers only for that very list, unchanged in length (a list is never
        edited in place here: requests are rebuilt, not mutated)."""
        got = self._history_memo.get(id(history))
        if got is not None and got[0] is history and got[1] == len(history):
            return got[2]
        enc = json_part([(h.item_id, h.text, h.rating) for h in history])
        if len(self._history_memo) >= self.HISTORY_MEMO:
            self._history_memo.clear()
        self._history_memo[id(history)] = (history, len(history), enc)
        return enc
