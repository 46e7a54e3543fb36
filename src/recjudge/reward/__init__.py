"""The BRIEF judge (evidence-first + CF bias), its ablations, batch scoring, results store."""

from recjudge.reward._ask import SLOT, ask, ask_shared, choose, choose_shared
from recjudge.reward._build import build_judge
from recjudge.reward._call import history_sent
from recjudge.reward._judge import Judge, JudgeExecutor, cf_identity, clear_prefix_cache
from recjudge.reward._judge_config import JUDGES, JudgeConfig
from recjudge.reward._judgment import (
    RECORDED_ERRORS,
    RUN_FAULT_NAMES,
    JudgeRequest,
    Judgment,
    RunSummary,
    is_run_fault,
)
from recjudge.reward._modes import (
    CF_MODES,
    LLM_MODES,
    MODE_SPECS,
    MODES,
    SIMULATOR_MODES,
    ModeSpec,
    mode_spec,
)
from recjudge.reward._plan import JudgePlan, plan_calls
from recjudge.reward._portable import (
    PortableCount,
    PortableError,
    export_portable,
    import_portable,
    reseal_portable,
    verify_portable,
)
from recjudge.reward._prompt import PROMPT_VERSION, HistoryItem, build_messages
from recjudge.reward._requests import request_for, requests_for, stored_request
from recjudge.reward._simulators import SIMULATORS, Population, diversity_count
from recjudge.reward._store import ResultsStore, StoreError, repair_store, salvage
from recjudge.reward._stored import (
    LEGACY_LLM,
    StoredAsk,
    adopt_former,
    adopt_rows,
    adopt_shared,
    ask_key,
    ask_stored,
    by_prompt_length,
    closed_form,
    default_result,
    generate_stored,
    run_stored,
)
from recjudge.reward._sweep import (
    SWEEPABLE,
    SweepFill,
    can_sweep,
    judge_per_user,
    judge_sweep,
    llm_made,
    sweep_into_store,
)
from recjudge.reward._tune import TUNE_VERSION, TuneConfig, TuneResult, tune
from recjudge.reward._tune_pairs import EvidenceRule, TunePair, TunePairs, build_pairs

__all__ = [
    "TUNE_VERSION",
    "EvidenceRule",
    "TuneConfig",
    "TunePair",
    "TunePairs",
    "TuneResult",
    "build_pairs",
    "tune",
    "clear_prefix_cache",
    "stored_request",
    "SIMULATORS",
    "SIMULATOR_MODES",
    "Population",
    "diversity_count",
    "JUDGES",
    "CF_MODES",
    "LLM_MODES",
    "MODE_SPECS",
    "ModeSpec",
    "mode_spec",
    "MODES",
    "PROMPT_VERSION",
    "RECORDED_ERRORS",
    "RUN_FAULT_NAMES",
    "is_run_fault",
    "SLOT",
    "SWEEPABLE",
    "HistoryItem",
    "Judge",
    "JudgeExecutor",
    "JudgePlan",
    "JudgeConfig",
    "JudgeRequest",
    "Judgment",
    "PortableCount",
    "PortableError",
    "ResultsStore",
    "RunSummary",
    "StoreError",
    "StoredAsk",
    "LEGACY_LLM",
    "ask_key",
    "SweepFill",
    "ask",
    "ask_shared",
    "choose",
    "choose_shared",
    "adopt_former",
    "adopt_shared",
    "adopt_rows",
    "ask_stored",
    "by_prompt_length",
    "can_sweep",
    "build_messages",
    "build_judge",
    "cf_identity",
    "closed_form",
    "default_result",
    "export_portable",
    "generate_stored",
    "import_portable",
    "reseal_portable",
    "verify_portable",
    "judge_sweep",
    "judge_per_user",
    "llm_made",
    "request_for",
    "run_stored",
    "plan_calls",
    "history_sent",
    "requests_for",
    "repair_store",
    "salvage",
    "sweep_into_store",
]
