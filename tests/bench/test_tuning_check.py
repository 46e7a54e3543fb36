"""``bench judge-tuning``'s teacher-forced check: the paired AUC over users, and the check
reproducing the tuning's own validation AUC from the adapter it saved (so a gap between the
card and the report's rows is measured, not guessed)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from recjudge._tune_config import TuneConfig
from recjudge.bench._brief import _requests
from recjudge.bench._tuning import JudgeTuningConfig
from recjudge.bench._tuning_check import SETS, paired_auc, teacher_forced_check
from recjudge.llm._card import read_card
from recjudge.tune import tune


def test_paired_auc_is_antisymmetric_and_zero_on_equal_scores():
    g = np.random.default_rng(1)
    y = [1, 0] * 20
    users = [f"u{n // 4}" for n in range(40)]
    a = (np.asarray(y) + g.normal(0, 1, 40)).tolist()
    b = g.normal(0, 1, 40).tolist()
    ab, ba = paired_auc(a, b, y, users, 200, 0), paired_auc(b, a, y, users, 200, 0)
    assert ab["diff"] == pytest.approx(-ba["diff"])
    assert ab["lo"] == pytest.approx(-ba["hi"]) and ab["hi"] == pytest.approx(-ba["lo"])
    assert ab["users"] == 10 and ab["pairs"] == 40 and ab["draws"] == 200
    same = paired_auc(a, a, y, users, 50, 0)
    assert same["diff"] == same["lo"] == same["hi"] == 0.0


def test_paired_auc_resamples_users_not_pairs():
    """One user holds every positive: a draw without that user has no positive and is
    dropped, which a pair bootstrap would never do."""
    y = [1, 1, 0, 0, 0, 0]
    users = ["a", "a", "b", "b", "c", "c"]
    got = paired_auc([2, 3, 0, 1, 0, 1], [0, 0, 1, 1, 1, 1], y, users, 300, 0)
    assert got["a"] == 1.0 and got["b"] == 0.0
    # P(user a drawn at least once in 3 draws) = 1 - (2/3)^3 = 0.70
    assert 0.55 < got["draws"] / 300 < 0.85


def test_the_check_reproduces_the_cards_validation_auc(tiny_dir, ml100k, tmp_path):
    bench = JudgeTuningConfig(model=str(tiny_dir), data="ml-100k", users=4, history_items=5)
    reqs, info = _requests(bench, ml100k)
    past, users = info["past"], list(info["users"])
    log = ml100k.with_interactions(past, "the past split")
    tc = TuneConfig(model=str(tiny_dir), max_history=5, steps=4, batch_size=2, eval_every=2,
                    patience=10, max_users=8, validation_users=4, positives_per_user=1,
                    device="cpu", lr=1e-2)  # fmt: skip
    tune(tc, log, tmp_path / "tuned", exclude_users=users, progress=False)
    card = read_card(tmp_path / "tuned")
    got = teacher_forced_check(SimpleNamespace(bootstrap=20, seed=0, model=str(tiny_dir)),
                               ml100k, past, reqs,
                               users, tmp_path / "tuned", card)  # fmt: skip
    assert got["models"] == ["base", "tuned, adapter as trained (fp32)",
                             "tuned, merged folder (fp32 load)"]  # fmt: skip
    val = SETS[0]
    assert got["auc"]["base"][val]["a"] == pytest.approx(card["validation_auc_before"], abs=1e-6)
    adapter = got["auc"]["tuned, adapter as trained (fp32)"][val]
    assert adapter["a"] == pytest.approx(card["validation_auc"], abs=1e-6)
    assert adapter["b"] == got["auc"]["base"][val]["a"]
    ev = got["sets"][SETS[2]]
    assert ev["pairs"] == sum(r.meta["kind"] == "relevance" for r in reqs) and ev["users"] == 4
    # the evaluation users' own past: only theirs
    assert got["sets"][SETS[1]]["users"] <= 4
