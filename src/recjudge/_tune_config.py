"""The settings of ``recjudge judge tune`` (pure pydantic: the command line builds its options
from them without importing torch; ``recjudge.tune`` runs them)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from recjudge._util import native_bf16, stable_hash

#: v2: validation scores in fp32 (v1 scored them in bf16 autocast); v3: the decision margin
#: over every token that commits to YES / NO (the read-out's), not the two target tokens
TUNE_VERSION = "tune-v3"


class TuneConfig(BaseModel):
    """How a judge model is tuned (every field is in the card; ``TUNE_KEYED`` enter the
    checkpoint's fingerprint, so a resume with other settings is refused).

    Attributes:
        model: the base model (preset, folder or hub id).
        max_history: history items the prompt shows (as the judge's ``--max-history``).
        max_evidence: most titles an answer may cite (as the judge's).
        evidence_items: most titles a positive's target cites (the evidence rule).
        future_fraction: the share of each user's timeline whose items are positives
            (the pairs: ``tune.build_pairs``).
        positives_per_user: most positives per user.
        negatives_per_positive: never-touched items drawn per positive.
        negatives: how negatives (and with them positives) are drawn: ``uniform`` from the
            catalogue, or ``listed`` from the user's item-kNN and popularity lists, positives
            then the later interactions in that list (``tune._pairs`` states both rules).
        listed_items: with ``listed``, each recommender's list length.
        min_rating: a later interaction counts as a positive from this rating.
        validation_users: users held out for the validation AUC.
        max_users: most users the pairs are built from.
        min_history: fewest past items a user needs.
        before: only interactions before this time are read.
        rank: the LoRA adapter's rank.
        alpha: the adapter's scaling.
        dropout: the adapter's dropout.
        target_modules: the modules the adapter wraps.
        lr: the learning rate (AdamW, linear warm-up then decay to 0).
        steps: optimiser steps.
        batch_size: pairs per step.
        warmup: warm-up steps.
        eval_every: validation AUC every N steps.
        patience: stop after this many evaluations without a better AUC.
        seed: pairs, order and dropout.
        device: ``auto`` (CUDA when available), ``cpu``, ``cuda`` or ``cuda:N``.
        decision_weight: ``w`` in ``loss = token loss + w * mean softplus(-(2y - 1) * m)``,
            ``m = logsumexp(YES tokens) - logsumexp(NO tokens)`` at the decision token (the
            judge's read-out margin: every token committing to each branch), ``y`` the label:
            the token loss is spread over the evidence titles and the JSON, of which the
            verdict is one token; this term trains the score validation ranks by.
        precision: the training arithmetic (``resolved_precision``); the adapter, the
            optimiser state, the validation scores and the merge are fp32 whatever it is.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = Field("smollm2-135m", description="The base model: a preset, folder or HF id.")
    max_history: int = Field(50, ge=1, description="History items the prompt shows.")
    max_evidence: int = Field(5, ge=1, description="Most titles an answer may cite.")
    evidence_items: int = Field(2, ge=1, description="Most titles a positive's target cites.")
    future_fraction: float = Field(
        0.2, gt=0, lt=1, description="Each user's last fraction of the log: the positives."
    )
    positives_per_user: int = Field(3, ge=1, description="Most positives per user.")
    negatives_per_positive: int = Field(1, ge=1, description="Unseen items drawn per positive.")
    negatives: Literal["uniform", "listed"] = Field(
        "uniform", description="Negatives drawn uniformly from the catalogue, or from the items "
        "an item-kNN and a popularity recommender list for the user (positives: the user's "
        "later items in that list), where offline metrics count."
    )  # fmt: skip
    listed_items: int = Field(
        20, ge=1, le=1000, description="With --negatives listed: each recommender's list length."
    )
    min_rating: float | None = Field(
        None, description="A later interaction is a positive only when rated >= this."
    )
    validation_users: int = Field(50, ge=1, description="Users held out for early stopping.")
    max_users: int | None = Field(None, ge=1, description="A seeded sample of training users.")
    min_history: int = Field(3, ge=1, description="Skip users with fewer history items.")
    before: float | None = Field(
        None, description="Read only interactions with a timestamp strictly before this "
        "(the evaluated period never enters the tuning)."
    )  # fmt: skip
    rank: int = Field(8, ge=1, le=256, description="LoRA rank.")
    alpha: float = Field(16.0, gt=0, description="LoRA alpha (scale alpha / rank).")
    dropout: float = Field(0.05, ge=0, lt=1, description="LoRA dropout.")
    target_modules: tuple[str, ...] = Field(
        ("q_proj", "k_proj", "v_proj", "o_proj"), description="Modules LoRA adapts."
    )
    lr: float = Field(2e-4, gt=0, le=1, description="Peak learning rate (AdamW).")
    steps: int = Field(200, ge=1, description="Most optimiser steps.")
    batch_size: int = Field(4, ge=1, le=256, description="Pairs per optimiser step.")
    warmup: int = Field(10, ge=0, description="Warm-up steps.")
    decision_weight: float = Field(
        0.0, ge=0, description="Weight of a logistic loss on the decision margin "
        "(the judge's P(YES) as a logit) beside the answer's token loss (0: the token loss "
        "only)."
    )  # fmt: skip
    eval_every: int = Field(25, ge=1, description="Validation AUC every N steps.")
    patience: int = Field(3, ge=1, description="Evaluations without improvement before stopping.")
    seed: int = Field(0, description="Pairs, order and dropout seed.")
    device: str = Field("auto", description="auto (CUDA when available), cpu, cuda or cuda:N.")
    precision: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="Training arithmetic: auto (bf16 autocast on a GPU or a CPU with "
        "native bf16, else fp32), float32, or bfloat16 (autocast; weights stay fp32)."
    )  # fmt: skip

    #: ``device`` only moves the computation (the card records where it ran)
    UNKEYED: ClassVar[frozenset[str]] = frozenset({"device"})

    def resolved_precision(self, device: str) -> str:
        """``precision`` on ``device``: ``auto`` is bf16 on CUDA and on a CPU with native bf16
        (1.7x faster than fp32 here), else fp32 (emulated bf16 is slower than fp32)."""
        if self.precision != "auto":
            return self.precision

        return "bfloat16" if device.startswith("cuda") or native_bf16() else "float32"

    def fingerprint(self) -> str:
        """What a checkpoint was made under: every field but ``device`` (``listed_items``
        only with ``listed`` negatives, and neither field at ``uniform``, so checkpoints made
        before the two fields existed keep their fingerprint)."""
        dump = self.model_dump(mode="json", exclude={"device"})
        if dump["negatives"] == "uniform":
            del dump["negatives"], dump["listed_items"]
        return stable_hash(TUNE_VERSION, dump)


class TuneJob(TuneConfig):
    """``recjudge judge tune``: ``TuneConfig`` plus the log, the users kept out and the folder."""

    data: str = Field(description="The team's log (dataset name or folder): the past only.")
    out: str = Field(description="The tuned model folder (checkpoints in OUT.tune/).")
    exclude_users: str | None = Field(
        None, description="A file of users the tuning never reads (a column user_id in CSV, "
        "JSONL or Parquet, e.g. a gold sample, or one id per line): those you evaluate or label."
    )  # fmt: skip
    resume: bool = Field(False, description="Continue the checkpoint in OUT.tune/.")
