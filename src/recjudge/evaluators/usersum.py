"""UserSumBench (user summaries judged by prediction tasks): the public names of this family (also
importable flat from ``recjudge.evaluators``)."""

from recjudge.evaluators._usersum import (
    UserSumConfig,
    run_usersum,
    time_range,
)
from recjudge.evaluators._usersum_metrics import (
    TASKS,
    bleu,
    make_mcq,
    rouge_l,
    rouge_n,
    segment,
    summary_quality,
    time_segments,
    usersum_metrics,
)
from recjudge.evaluators._usersum_prompts import (
    regenerate_messages,
    summary_messages,
)

__all__ = [
    "UserSumConfig",
    "run_usersum",
    "time_range",
    "TASKS",
    "bleu",
    "make_mcq",
    "rouge_l",
    "rouge_n",
    "segment",
    "summary_quality",
    "time_segments",
    "usersum_metrics",
    "regenerate_messages",
    "summary_messages",
]
