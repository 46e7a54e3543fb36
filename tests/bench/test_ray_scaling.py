"""``bench ray-scaling``: the driver's cost without a cluster (default suite); the whole
bench at tiny size on its own local cluster (``make test-ray``)."""

from __future__ import annotations

import json

import pytest

from recjudge.bench._ray_scaling import (
    RayScalingConfig,
    _driver_cost,
    _with_total,
    bench_ray_scaling,
)
from recjudge.reward import JudgeConfig


def test_driver_cost_counts_every_step(ml100k):
    c = RayScalingConfig(driver_users=5, driver_candidates=4)
    d = _driver_cost(c, ml100k, JudgeConfig(need_evidence=False, batch_size=4))
    assert d["judgments"] == 20 and d["calls"] == 5  # 4 per call: each user its own call
    steps = d["seconds_per_judgment"]
    assert set(steps) == {
        "requests built",
        "keys",
        "sigma (CF model)",
        "calls planned and serialised",
        "results parsed and merged (store)",
    }
    assert all(v > 0 for v in steps.values())
    # the first pass (first uses inside) beside the table's, step by step
    assert set(d["first_pass_us_per_judgment"]) == set(steps)
    assert d["first_uses_s_per_run"] >= 0
    # the calls as a worker would get them: every pair once, with its key and sigma
    calls = d.pop("_calls")
    assert sorted(x["i"] for call in calls for x in call) == list(range(20))
    assert all({"key", "sigma", "req"} <= set(x) for call in calls for x in call)
    d = _with_total(d, c)
    assert d["total_us"] == pytest.approx(sum(steps.values()), abs=0.5)
    assert d["workers_one_driver_feeds"] == pytest.approx(
        d["judgments_per_s_one_driver"] / c.worker_rate, abs=0.1
    )


@pytest.mark.ray
@pytest.mark.model
def test_bench_runs_every_path_with_the_same_answers(tmp_path):
    c = RayScalingConfig(users=2, candidates=3, driver_users=3, driver_candidates=2,
                         need_evidence=False)  # fmt: skip
    r = bench_ray_scaling(c, tmp_path)
    assert set(r["paths"]) == {"one process", "Ray, 1 worker(s) x 2 thread(s)",
                               "Ray, 2 worker(s) x 1 thread(s)"}  # fmt: skip
    # (equal answers are test_ray's, in fp32 at equal threads: here thread counts differ)
    for p in r["paths"].values():
        assert p["failed"] == 0 and p["yes"] <= r["pairs"]
        assert isinstance(p["same_verdicts_as_one_process"], bool)
        assert p["end_to_end_s"] >= p["first_result_s"] > 0
    rd = r["driver"]["ray_data"]  # Ray Data's own driver cost, measured on the cluster
    assert rd["blocks"] >= 1 and rd["repeated_blocks"] >= rd["blocks"] + 32
    # the slope is a difference of two CPU times: on a 1-block workload it may not resolve
    # (0 and resolved False then, never a negative cost)
    assert rd["driver_cpu_ms_per_block"] >= 0 and isinstance(rd["resolved"], bool)
    assert rd["resolved"] or rd["driver_cpu_ms_per_block"] == 0
    assert "Ray Data: blocks streamed (driver CPU)" in r["driver"]["seconds_per_judgment"]
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["config"] == c.model_dump(mode="json")
    assert (tmp_path / "report.md").exists() and (tmp_path / "report.html").exists()
