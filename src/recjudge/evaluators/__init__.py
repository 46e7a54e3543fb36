"""Evaluators that reuse the reward core, grouped per family: ``offline`` (run files,
impute, evaluate, augment, the metric estimators), ``arena`` (RecSys Arena), ``gist``
(GISTBench), ``usersum`` (UserSumBench); every family's names are also importable from here,
and ``EVALUATORS`` is the registry the CLI dispatches through."""

from recjudge.evaluators import arena, gist, offline, usersum
from recjudge.evaluators._registry import EVALUATORS, EvaluatorSpec
from recjudge.evaluators.arena import *  # noqa: F403
from recjudge.evaluators.gist import *  # noqa: F403
from recjudge.evaluators.offline import *  # noqa: F403
from recjudge.evaluators.offline._jobs import JOBS, JobSpec
from recjudge.evaluators.usersum import *  # noqa: F403

__all__ = [  # noqa: PLE0604 - the families' own lists
    "EVALUATORS",
    "JOBS",
    "JobSpec",
    "EvaluatorSpec",
    *arena.__all__,
    *gist.__all__,
    *offline.__all__,
    *usersum.__all__,
]
