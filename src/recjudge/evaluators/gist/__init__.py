"""GISTBench (interest extraction, grounding and verification): the public names of this family
(also importable flat from ``recjudge.evaluators``)."""

from recjudge.evaluators.gist._examples import (
    EXAMPLE_SYSTEMS,
    example_profiles,
    write_example_profiles,
)
from recjudge.evaluators.gist._gist import (
    GistConfig,
    Predicate,
    build_oracle,
    echoes_example,
    gist_differences,
    gist_intervals,
    gist_scores,
    global_pool,
    load_categories,
    names_signal,
    read_interest_records,
    read_oracle,
    specificity_options,
    user_scores,
)
from recjudge.evaluators.gist._pipeline import (
    gist_extraction_asks,
    judge_answers_path,
    run_gist,
    verify_profiles,
)

__all__ = [
    "EXAMPLE_SYSTEMS",
    "example_profiles",
    "write_example_profiles",
    "GistConfig",
    "Predicate",
    "build_oracle",
    "echoes_example",
    "gist_differences",
    "gist_intervals",
    "gist_scores",
    "global_pool",
    "load_categories",
    "names_signal",
    "read_interest_records",
    "read_oracle",
    "specificity_options",
    "user_scores",
    "gist_extraction_asks",
    "judge_answers_path",
    "run_gist",
    "verify_profiles",
]
