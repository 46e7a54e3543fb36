"""``recjudge judge tune``: LoRA on a team's own log (the trainer, its pairs and what the
card records), merged into a model folder every backend loads.

Above ``reward`` (it prompts exactly as the judge does) and below the evaluators, benches and
command line that run it. The card itself (``llm.read_card``, ``llm.check_tuned``) lives in
``llm``: every loader checks it."""

from recjudge._tune_config import TUNE_VERSION, TuneConfig, TuneJob
from recjudge.tune._pairs import EvidenceRule, Lister, TunePair, TunePairs, build_pairs
from recjudge.tune._trainer import (
    BEST_FILE,
    LORA_FILE,
    Example,
    TuneResult,
    answer_text,
    base_digest,
    base_folder,
    branch_tokens,
    check_resumable,
    decision_loss,
    decision_scores,
    encode_examples,
    encode_pair,
    learning_rate,
    load_trainable,
    order_of,
    pad_id,
    prompting_judge,
    set_lora,
    suspicious_training,
    training_loss,
    tune,
    tuning_pairs,
    used_examples,
    validation_auc,
)

__all__ = [
    "BEST_FILE",
    "LORA_FILE",
    "TUNE_VERSION",
    "EvidenceRule",
    "Example",
    "Lister",
    "TuneConfig",
    "TuneJob",
    "TunePair",
    "TunePairs",
    "TuneResult",
    "answer_text",
    "base_digest",
    "base_folder",
    "branch_tokens",
    "build_pairs",
    "check_resumable",
    "decision_loss",
    "decision_scores",
    "encode_examples",
    "encode_pair",
    "learning_rate",
    "load_trainable",
    "order_of",
    "pad_id",
    "prompting_judge",
    "set_lora",
    "suspicious_training",
    "training_loss",
    "tune",
    "tuning_pairs",
    "used_examples",
    "validation_auc",
]
