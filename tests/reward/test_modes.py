"""Judge modes as data: the records say what each mode is, and everything that lists
modes (the config's Literal, the sweep, the benches) is derived from them."""

from __future__ import annotations

from typing import get_args

import pytest

from recjudge.reward import (
    CF_MODES,
    LLM_MODES,
    MODE_SPECS,
    MODES,
    SIMULATOR_MODES,
    SWEEPABLE,
    JudgeConfig,
)
from recjudge.reward._judge_config import Mode


def test_every_list_of_modes_is_derived_from_the_records():
    assert get_args(Mode) == MODES == tuple(MODE_SPECS)
    assert set(SIMULATOR_MODES) == {m for m in MODES if MODE_SPECS.get(m).simulator}
    assert set(SWEEPABLE) == {m for m in MODES if MODE_SPECS.get(m).sweepable}
    assert set(CF_MODES) == {m for m in MODES if MODE_SPECS.get(m).uses_cf}
    assert set(LLM_MODES) == {m for m in MODES if MODE_SPECS.get(m).uses_llm}


@pytest.mark.parametrize("mode", MODES)
def test_the_config_follows_its_modes_record(mode):
    spec = MODE_SPECS.get(mode)
    c = JudgeConfig(mode=mode, beta=7.0)
    assert c.uses_cf() is spec.uses_cf and c.uses_llm() is spec.uses_llm
    assert c.plain_verdict() is spec.plain_verdict
    assert c.effective_beta() == (0.0 if spec.bias == "none" else 7.0)
    assert c.branch_bias().adaptive is (spec.bias != "fixed")


def test_the_ablations_are_what_the_brief_paper_defines():
    # BRIEF's fusion is Delta = beta (1 + E_n) sigma; its Non-adaptive ablation has no entropy
    # adaptation (Delta = beta sigma, ../shared/PAPERS.md: inferred, the paper gives no
    # formula); no-behavior keeps the LLM alone; zero-shot answers without evidence
    assert MODE_SPECS.get("brief").bias == "adaptive" and MODE_SPECS.get("brief").uses_cf
    assert MODE_SPECS.get("non-adaptive").bias == "fixed"
    assert MODE_SPECS.get("no-behavior").bias == "none"
    assert not MODE_SPECS.get("no-behavior").uses_cf
    assert MODE_SPECS.get("zero-shot").plain_verdict
    assert not MODE_SPECS.get("cf-only").uses_llm
    with pytest.raises(Exception, match="Did you mean 'brief'"):
        MODE_SPECS.get("brieff")
