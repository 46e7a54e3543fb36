"""The BRIEF judge (evidence-first + CF bias), its ablations, batch scoring, results store."""

from recjudge.reward._ask import SLOT, ask, ask_shared, choose, choose_shared
from recjudge.reward._judge import (
    JUDGES,
    MODES,
    RECORDED_ERRORS,
    SIMULATOR_MODES,
    Judge,
    JudgeConfig,
    JudgeRequest,
    Judgment,
    RunSummary,
    cf_identity,
    request_for,
    requests_for,
)
from recjudge.reward._portable import (
    PortableCount,
    PortableError,
    export_portable,
    import_portable,
    reseal_portable,
)
from recjudge.reward._prompt import PROMPT_VERSION, HistoryItem, build_messages
from recjudge.reward._simulators import SIMULATORS, Population, diversity_count
from recjudge.reward._store import ResultsStore, StoreError, salvage
from recjudge.reward._stored import (
    StoredAsk,
    ask_stored,
    by_prompt_length,
    closed_form,
    default_result,
    generate_stored,
    run_stored,
)
from recjudge.reward._sweep import SWEEPABLE, SweepFill, can_sweep, judge_sweep, sweep_into_store

__all__ = [
    "SIMULATORS",
    "SIMULATOR_MODES",
    "Population",
    "diversity_count",
    "JUDGES",
    "MODES",
    "PROMPT_VERSION",
    "RECORDED_ERRORS",
    "SLOT",
    "SWEEPABLE",
    "HistoryItem",
    "Judge",
    "JudgeConfig",
    "JudgeRequest",
    "Judgment",
    "PortableCount",
    "PortableError",
    "ResultsStore",
    "RunSummary",
    "StoreError",
    "StoredAsk",
    "SweepFill",
    "ask",
    "ask_shared",
    "choose",
    "choose_shared",
    "ask_stored",
    "by_prompt_length",
    "can_sweep",
    "build_messages",
    "cf_identity",
    "closed_form",
    "default_result",
    "export_portable",
    "generate_stored",
    "import_portable",
    "reseal_portable",
    "judge_sweep",
    "request_for",
    "run_stored",
    "requests_for",
    "salvage",
    "sweep_into_store",
]
