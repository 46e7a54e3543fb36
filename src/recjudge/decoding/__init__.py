"""Grammars compiled per (schema, tokenizer), per-row matchers, and the branch bias."""

from recjudge.decoding._api import (
    BranchBias,
    ConstrainedOutput,
    collect_outputs,
    constrained_generate,
    make_processors,
)
from recjudge.decoding._compile import (
    GRAMMARS,
    CompiledSchema,
    GrammarCache,
    TokenTable,
    compile_schema,
)
from recjudge.decoding._decode import CapabilityError, DecodeJob, decode, lead_ids, require
from recjudge.decoding._processors import (
    BranchBiasProcessor,
    DecisionRecord,
    DecisionStep,
    GrammarLogitsProcessor,
    Replayed,
    branch_deltas,
    replay_greedy,
)
from recjudge.decoding._remote import BiasPayload, engine_constrained
from recjudge.decoding._schemas import (
    EVIDENCE_OPEN,
    Choice,
    CitedList,
    DecisionSpec,
    EvidenceFirst,
    Picks,
    QAPairs,
    Schema,
    SchemaError,
    Verdicts,
    json_literal,
)

__all__ = [
    "CapabilityError",
    "DecodeJob",
    "require",
    "decode",
    "lead_ids",
    "EVIDENCE_OPEN",
    "GRAMMARS",
    "BiasPayload",
    "BranchBias",
    "BranchBiasProcessor",
    "Choice",
    "CitedList",
    "Picks",
    "QAPairs",
    "CompiledSchema",
    "ConstrainedOutput",
    "DecisionRecord",
    "DecisionStep",
    "DecisionSpec",
    "EvidenceFirst",
    "GrammarCache",
    "GrammarLogitsProcessor",
    "Schema",
    "SchemaError",
    "TokenTable",
    "Verdicts",
    "Replayed",
    "branch_deltas",
    "replay_greedy",
    "collect_outputs",
    "compile_schema",
    "constrained_generate",
    "engine_constrained",
    "json_literal",
    "make_processors",
]
