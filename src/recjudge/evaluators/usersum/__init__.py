"""UserSumBench (user summaries judged by prediction tasks): the public names of this family (also
importable flat from ``recjudge.evaluators``)."""

from recjudge.evaluators.usersum._metrics import (
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
from recjudge.evaluators.usersum._prompts import (
    regenerate_messages,
    summary_messages,
)
from recjudge.evaluators.usersum._usersum import (
    UserSumConfig,
    run_usersum,
    time_range,
    usersum_summary_asks,
)

__all__ = [
    "UserSumConfig",
    "run_usersum",
    "usersum_summary_asks",
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
