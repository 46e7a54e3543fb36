"""``bench brief-offline-estimators``' transport rows (``_imputer_gold``): the best test's
power that bounds what any check on a gold sample can flag, the judges the check runs on, and
the report's table with a row per judge."""

from __future__ import annotations

import numpy as np
import pytest

from recjudge.bench._imputer_gold import (
    TRANSPORT_AUCS,
    _transport_rows,
    imputer_summary,
    oracle_power,
    transport_judges,
    transport_row,
)
from recjudge.bench._offline_estimators import synthetic_name


def test_the_best_tests_power_is_its_level_without_a_bias():
    # residuals of mean exactly 0: the two-sided test flags at its level, whatever n
    r = np.array([-0.3, 0.1, 0.2, -0.1, 0.1])
    for n in (5, 50, 5000):
        assert oracle_power(r, n) == pytest.approx(0.05, abs=1e-12)
        assert oracle_power(r, n, alpha=0.1) == pytest.approx(0.1, abs=1e-12)


def test_the_best_tests_power_grows_with_the_bias_and_the_gold_pairs():
    g = np.random.default_rng(0)
    y = (g.uniform(size=4000) < 0.2).astype(float)
    powers = [oracle_power(y - y.mean() + d, n) for d in (0.01, 0.05) for n in (50, 500)]
    small_few, small_many, big_few, big_many = powers
    assert small_few < small_many < big_many and small_few < big_few < big_many
    # 0.05 on 500 pairs of sd 0.4 is 2.8 standard errors: Phi(2.8 - 1.96) = 0.80
    assert 0.75 < big_many < 0.85
    assert oracle_power(-(y - y.mean() + 0.05), 500) == pytest.approx(big_many)  # two-sided
    assert oracle_power(np.array([]), 10) != oracle_power(np.array([]), 10)  # nan: no pairs
    assert oracle_power(y, 1) != oracle_power(y, 1)  # nan: one pair has no spread


def test_the_best_tests_power_is_what_a_z_test_with_the_spread_known_flags():
    """Draw ``n`` pairs of the residuals again and again: the z-test that knows their spread
    flags at the stated power (the formula is that test's; residuals spread smoothly, so the
    mean of ``n`` of them is as normal as the formula takes it)."""
    g = np.random.default_rng(1)
    resid = g.normal(0.03, 0.36, 3000)
    n, reps = 120, 4000
    sd = resid.std()
    draws = g.choice(resid, size=(reps, n))
    flagged = np.abs(draws.mean(axis=1)) / (sd / np.sqrt(n)) > 1.959963984540054
    want = oracle_power(resid, n)
    assert 0.1 < want < 0.9  # a power the check can be wrong about either way
    assert abs(flagged.mean() - want) < 4 * np.sqrt(want * (1 - want) / reps)


class _World:
    def __init__(self, names):
        self.imputers = {name: (np.zeros(3), np.zeros(3)) for name in names}


def test_the_check_runs_on_the_judge_and_the_synthetic_judges_the_world_holds():
    synth = [synthetic_name(a) for a in TRANSPORT_AUCS]
    w = _World(["judge:brief", synth[0], "cf"])
    assert transport_judges(w, "judge:brief") == ["judge:brief", synth[0]]
    w = _World(["judge:brief", *synth])
    assert transport_judges(w, "judge:brief") == ["judge:brief", *synth]
    # the judge keeps the key older results have; the others are named in theirs
    assert transport_row("judge:brief", "judge:brief") == "transport"
    assert transport_row(synth[0], "judge:brief") == f"transport [{synth[0]}]"


def _cells(flagged: float, oracle: float) -> tuple[float, ...]:
    # _transport_flags' tuple: planted, others, honest world, where it transports (share,
    # systems), where it does not (share, systems), true bias, detectable, best test's power
    return (flagged, 0.0, 0.05, 0.0, 4, float("nan"), 0, 0.05, 0.1, oracle)


def test_the_summary_and_the_table_carry_a_row_per_judge():
    synth = synthetic_name(TRANSPORT_AUCS[0])
    log = {
        (300, "uniform", "transport", "-"): [_cells(0.0, 0.3), _cells(1.0, 0.5)],
        (300, "uniform", f"transport [{synth}]", "-"): [_cells(1.0, 0.97), _cells(1.0, 0.99)],
    }
    got = imputer_summary([log])
    judge = got["300"]["uniform"]["transport"]
    other = got["300"]["uniform"][f"transport [{synth}]"]
    assert judge["planted_flagged"] == 0.5 and judge["planted_oracle_power"] == pytest.approx(0.4)
    assert other["planted_flagged"] == 1.0 and other["planted_oracle_power"] == pytest.approx(0.98)
    assert judge["samples"] == other["samples"] == 2
    rows = _transport_rows(got, "judge:brief")
    assert len(rows) == 2
    assert rows[0].startswith("| judge:brief | 300 | uniform | 2 | 50.0 % |")
    assert rows[0].endswith("| 40.0 % |")
    assert rows[1].startswith(f"| {synth} | 300 | uniform | 2 | 100.0 % |")
    # older results (no best test's column) still print
    old = {"300": {"uniform": {"transport": {**judge, "planted_oracle_power": None}}}}
    assert _transport_rows(old, "judge:brief")[0].endswith("| n/a |")
