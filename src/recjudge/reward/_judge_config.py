"""The judge's configuration (``JudgeConfig``: every field keyed or not) and its modes' names
(``Mode``, the ``JUDGES`` registry; what each mode is lives in ``reward._modes``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from recjudge._registry import Registry
from recjudge.decoding import BranchBias, Choice, EvidenceFirst
from recjudge.llm import (
    SamplingConfig,
)
from recjudge.reward._modes import MODES, ModeSpec, mode_spec

if TYPE_CHECKING:
    pass


#: the judge modes, from their records (``reward._modes``: one place says what each is)
Mode = Literal[MODES]  # type: ignore[valid-type]


JUDGES: Registry[str] = Registry("judge mode")


for _m in MODES:
    JUDGES.register(_m, _m)


class JudgeConfig(BaseModel):
    """Everything that defines a judge (and, with the request, its result key).

    Attributes:
        model: LLM preset, path or Hugging Face id.
        mode: brief (evidence-first + adaptive bias), non-adaptive (Delta = beta*sigma),
            no-behavior (beta = 0), zero-shot (plain YES/NO), cf-only (sigma > threshold),
            item-item (brief with the item-item sigma); pub, agent4rec, recagent (user
            simulators: an LLM persona of the user, then a plain YES/NO in that role).
        beta: bias strength (the paper's best is 25).
        max_evidence: most titles one answer may cite.
        token_budget / max_history: history shown in the prompt.
        show_ratings: show the user's ratings next to history items.
        rating_scale: the top of the rating scale, for "rated r/scale".
        cf_threshold: the cf-only verdict is sigma > threshold.
        need_evidence: generate the evidence list; False stops at the decision step
            (reward only, much faster).
        sampling: decoding settings (greedy by default).
        samples: with sampling, how many samples estimate P(YES).
        batch_size: requests judged per engine call (never changes a result). None: from
            the work, every candidate a user's history serves in one call (at most
            ``AUTO_ROWS``), so all of them are decoded in the same steps.
        decode_rows: rows per decode batch. With ``deterministic`` it is the fixed row
            count of every decode step and part of the result key (other values round
            differently; None keys and runs as ``INVARIANT_ROWS``); otherwise only a bound
            on the batch (None: every row of the call).
        deterministic: use the batch-invariant engine, whose results are bit-identical
            alone or in any batch (several times slower). The default fast engine agrees
            with it up to floating-point rounding.
        jump_forward_prefix: prefill the forced opening ``{"evidence`` instead of decoding it.
        domain: prompt wording (None: from the dataset).
        persona_tokens: simulators: most tokens of the persona answer.
        layout: where the candidate sits: ``candidate-last`` (after the question, the
            paper's prompt) or ``question-last`` (the candidate, then the question and the
            answer format, so the last text before the answer is ours, not the item's: a
            defence against instructions in item text, measured by ``bench run injection``).
            Keyed when not the default (keys made before it stay).
        marking: ``plain`` or ``datamark``: every space of item text (history and
            candidate) shown as ``ˆ`` and the system message told that marked text is data,
            never instructions (spotlighting, Hines et al., 2024); measured by ``bench run
            injection``. The evidence grammar keeps the clean titles. Keyed when not
            ``plain``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = "smollm2-135m"
    mode: Mode = "brief"
    beta: float = Field(25.0, ge=0)
    max_evidence: int = Field(5, ge=1)
    token_budget: int = Field(1500, ge=16)
    max_history: int = Field(50, ge=1)
    show_ratings: bool = True
    rating_scale: float | None = 5.0
    cf_threshold: float = 0.0
    need_evidence: bool = True
    sampling: SamplingConfig = SamplingConfig(max_new_tokens=256)
    samples: int = Field(1, ge=1)
    batch_size: int | None = Field(None, ge=1)
    decode_rows: int | None = Field(None, ge=1)
    deterministic: bool = False
    jump_forward_prefix: bool = True
    domain: str | None = None
    persona_tokens: int = Field(160, ge=8)
    layout: Literal["candidate-last", "question-last"] = "candidate-last"
    marking: Literal["plain", "datamark"] = "plain"

    # Every field is classified by name, and tests/reward/test_keys.py fails on a field that is
    # not: a new setting must say whether it changes an answer (and so re-keys every stored
    # judgment) or not. ``Judge._key`` builds keys from these sets alone.
    KEYED: ClassVar[frozenset[str]] = frozenset(
        {"model", "mode", "beta", "max_evidence", "token_budget", "max_history", "show_ratings",
         "rating_scale", "cf_threshold", "need_evidence", "sampling", "samples", "deterministic",
         "jump_forward_prefix", "domain"}
    )  # fmt: skip
    # Never changes a result: the batch a pair is decoded in (the fast engine agrees across
    # batch sizes up to rounding; the invariant engine's row count is decode_rows).
    UNKEYED: ClassVar[frozenset[str]] = frozenset({"batch_size"})
    # Keyed only when it acts: decode_rows on the batch-invariant engine (its fixed row count
    # sets the rounding), persona_tokens in the simulator modes.
    KEYED_WHEN: ClassVar[dict[str, str]] = {
        "decode_rows": "deterministic",
        "persona_tokens": "simulator",
        "layout": "not candidate-last",
        "marking": "not plain",
    }
    # Acts only at or after the decision: left out of the unbiased decision record's key, so
    # every sweepable setting shares one record.
    AFTER_DECISION: ClassVar[frozenset[str]] = frozenset(
        {"mode", "beta", "need_evidence", "cf_threshold"}
    )

    #: the most requests one call holds when ``batch_size`` is None (a user's candidates)
    AUTO_ROWS: ClassVar[int] = 64
    #: the batch-invariant engine's row count when ``decode_rows`` is None (its old default)
    INVARIANT_ROWS: ClassVar[int] = 8

    def batch(self) -> int:
        """Requests per engine call, resolved (``batch_size``, else ``AUTO_ROWS``)."""
        return self.batch_size or self.AUTO_ROWS

    def rows(self) -> int:
        """Rows per decode step, resolved: ``decode_rows``, else ``INVARIANT_ROWS`` on the
        batch-invariant engine and every row of the call on the fast one."""
        if self.decode_rows is not None:
            return self.decode_rows
        return self.INVARIANT_ROWS if self.deterministic else self.batch()

    def spec(self) -> ModeSpec:
        """This mode's record (``reward._modes``)."""
        return mode_spec(self.mode)

    def effective_beta(self) -> float:
        return 0.0 if self.spec().bias == "none" else self.beta

    def plain_verdict(self) -> bool:
        """A bare ``{"is_relevant": ...}`` answer (no evidence list)."""
        return self.spec().plain_verdict

    def uses_cf(self) -> bool:
        return self.spec().uses_cf

    def uses_llm(self) -> bool:
        return self.spec().uses_llm

    def branch_bias(self) -> BranchBias:
        """The decision-step bias of this mode (its record's ``bias``): Delta = beta (1 +
        E_n) sigma (adaptive), beta sigma (fixed), or beta 0 (none)."""
        return BranchBias(beta=self.effective_beta(), adaptive=self.spec().bias != "fixed")

    def schema_for(self, rendered: Any) -> Any:
        """The answer schema for a rendered prompt (its shown titles are citable)."""
        if self.plain_verdict():
            return Choice(["YES", "NO"], answer_key="is_relevant")
        return EvidenceFirst([h.title for h in rendered.shown], self.max_evidence)
