"""Augmentation retrainings: kept by content, and the same numbers with any number of workers."""

from __future__ import annotations

import json

import numpy as np
import pytest
from pydantic import ValidationError

from recjudge.bench import (
    BENCHMARKS,
    AugmentBenchConfig,
    RetrainWorkersConfig,
    bench_retrain_workers,
)
from recjudge.bench._augment import _deviations_note, _other_history
from recjudge.bench._retrain import METRICS, RetrainData, RetrainJob, retrain_all
from recjudge.cf_models import MODELS, SideInfo
from recjudge.data import timeline_split


@pytest.fixture(scope="module")
def data(ml100k):
    # 150 users' events: the properties hold on any log, and SASRec trains in a fraction of
    # the time it takes on all of ML-100K (six trainings per test).
    log = ml100k.interactions
    log = log[log["user_id"].isin(sorted(log["user_id"].unique())[:150])]
    past, future = timeline_split(log, fraction=0.2)
    test = future[future["rating"] >= 4.0]
    test_by = {str(u): set(g["item_id"].astype(str)) for u, g in test.groupby("user_id")}
    past_by = {str(u): g["item_id"].astype(str).tolist() for u, g in past.groupby("user_id")}
    users = sorted(u for u in test_by if u in past_by and len(test_by[u]) >= 5)[:6]
    items = ml100k.items["item_id"].astype(str).tolist()
    hist = {u: past_by[u] for u in users}
    return RetrainData(
        past, items, SideInfo.of(ml100k), users, hist, {u: test_by[u] for u in users}
    )


def _jobs(data: RetrainData) -> list[RetrainJob]:
    seen = {i for u in data.users for i in data.hist[u]}
    unseen = [i for i in data.items if i not in seen][:2]
    add = {u: list(unseen) for u in data.users}
    none = {u: [] for u in data.users}
    return [
        RetrainJob("sasrec", 0, none),
        RetrainJob("sasrec", 0, add),
        RetrainJob("sasrec", 1, add),
        RetrainJob("sasrec", 0, add),  # the same retraining again: trained once, read twice
    ]


def test_workers_change_no_number_and_results_are_kept(data, tmp_path, monkeypatch):
    cfg = AugmentBenchConfig(data="ml-100k", sasrec_epochs=1, workers=2)
    jobs = _jobs(data)
    one = retrain_all(cfg, data, jobs, tmp_path / "one", workers=1)
    two = retrain_all(cfg, data, jobs, tmp_path / "two", workers=2)
    assert len(one) == len(two) == len(jobs)
    for a, b in zip(one, two, strict=True):
        assert a.shape == (len(data.users), len(METRICS))
        np.testing.assert_array_equal(a, b)  # each job seeded and on one thread
    np.testing.assert_array_equal(one[1], one[3])
    # 4 jobs, 3 distinct; the 2 that add items also keep their logged-history twin
    assert len(list((tmp_path / "two").glob("sasrec-*.json"))) == 5

    def refuse(*args, **kwargs):
        raise AssertionError("retrained although the result was kept")

    monkeypatch.setattr(MODELS.get("sasrec"), "train", refuse)
    again = retrain_all(cfg, data, jobs, tmp_path / "two", workers=2)
    for a, b in zip(again, two, strict=True):
        np.testing.assert_array_equal(a, b)


def test_score_from_picks_the_history_and_one_training_keeps_both(data, tmp_path, monkeypatch):
    cls = MODELS.get("sasrec")
    scored: list[list[str]] = []
    score_history = cls.score_history

    def spy(self, history, user_id=None):
        scored.append(list(history))
        return score_history(self, history, user_id)

    monkeypatch.setattr(cls, "score_history", spy)
    cfg = AugmentBenchConfig(data="ml-100k", sasrec_epochs=1)
    none, add = _jobs(data)[:2]
    logged_add = RetrainJob("sasrec", 0, add.added, "logged")
    logged_none = RetrainJob("sasrec", 0, none.added, "logged")  # nothing added: as ``none``
    got = retrain_all(cfg, data, [logged_add, logged_none], tmp_path / "kept", workers=1)
    logged = [data.hist[u] for u in data.users]
    augmented = [data.hist[u] + add.added[u] for u in data.users]
    # the job's own history, then the other one from the same model; ``none`` scores once
    assert scored == logged + augmented + logged
    assert len(list((tmp_path / "kept").glob("sasrec-*.json"))) == 3

    def refuse(*args, **kwargs):
        raise AssertionError("retrained although the result was kept")

    trained = cls.train
    monkeypatch.setattr(cls, "train", refuse)
    twins = retrain_all(cfg, data, [add, none], tmp_path / "kept", workers=1)
    np.testing.assert_array_equal(twins[1], got[1])
    monkeypatch.setattr(cls, "train", trained)
    # the kept twin is what training the augmented-history job itself gives
    direct = retrain_all(cfg, data, [add], tmp_path / "direct", workers=1)
    np.testing.assert_array_equal(twins[0], direct[0])
    with pytest.raises(ValueError, match="score_from must be one of augmented, logged"):
        RetrainJob("sasrec", 0, add.added, "latest")
    with pytest.raises(ValidationError):
        AugmentBenchConfig(score_from="latest")


def test_workers_must_be_positive(data, tmp_path):
    with pytest.raises(ValidationError):
        AugmentBenchConfig(workers=0)
    with pytest.raises(ValueError, match="workers must be >= 1"):
        retrain_all(AugmentBenchConfig(data="ml-100k"), data, _jobs(data), tmp_path, workers=0)
    cfg = AugmentBenchConfig(workers=2)
    assert AugmentBenchConfig.model_validate_json(cfg.model_dump_json()) == cfg


def test_bench_runs_the_same_jobs_under_each_setting(tmp_path):
    cfg = RetrainWorkersConfig(data="ml-100k", users=4, rec="pop", seeds=2, workers=(1, 2))
    assert RetrainWorkersConfig.model_validate_json(cfg.model_dump_json()) == cfg
    assert BENCHMARKS.get("retrain-workers").config is RetrainWorkersConfig
    r = bench_retrain_workers(cfg, tmp_path, progress=False)
    assert r["jobs"] == 4 and r["users"] == 4
    assert [s["identical_to_first"] for s in r["settings"].values()] == [4, 4]
    assert set(r["ratios"]) == {"workers 2 vs 1"} and r["ratios"]["workers 2 vs 1"] > 0
    assert json.loads((tmp_path / "results.json").read_text())["config"]["workers"] == [1, 2]
    assert "| 2 |" in (tmp_path / "report.md").read_text()
    for bad in ({"workers": (1, 1)}, {"workers": (0,)}, {"methods": ("brief",)}):
        with pytest.raises(ValidationError):
            RetrainWorkersConfig(**bad)


def test_report_header_names_the_protocol_deviations():
    note = _deviations_note(AugmentBenchConfig(retrain=("als", "sasrec"), sasrec_epochs=30,
                                          methods=("none", "brief")))  # fmt: skip
    assert "last training timestamp" in note and "30 epochs" in note
    assert "pub" in note and "agent4rec" in note and "recagent" in note
    methods = ("none", "brief", "pub", "agent4rec", "recagent")
    als_only = _deviations_note(AugmentBenchConfig(retrain=("als",), methods=methods))
    assert "epochs" not in als_only and "not run" not in als_only
    assert "scores from them" in note and "logged history alone" not in note
    logged = _deviations_note(AugmentBenchConfig(retrain=("sasrec",), score_from="logged"))
    assert "logged history alone" in logged and "scores from them" not in logged


def test_other_history_pairs_each_method_on_the_same_models():
    rng = np.random.default_rng(0)
    none = [rng.random((5, len(METRICS))) for _ in range(2)]
    brief = [rng.random((5, len(METRICS))) for _ in range(2)]
    twin = [b - 0.25 for b in brief]  # scored from the other history: 0.25 lower everywhere
    cfg = AugmentBenchConfig(methods=("none", "brief"), seeds=2, score_from="logged", bootstrap=200)
    oh = _other_history(cfg, {"sasrec": {"none": none, "brief": brief}},
                        {"sasrec": {"none": none, "brief": twin}})  # fmt: skip
    assert oh["score_from"] == "augmented"
    rows = oh["this_minus_other"]["sasrec"]
    assert set(rows) == {"brief"}  # ``none`` adds nothing: the same history either way
    cell = rows["brief"]["recall@10"]
    assert cell["estimate"] == pytest.approx(0.25)
    assert cell["users"]["lo"] == pytest.approx(0.25) and cell["users"]["hi"] == pytest.approx(0.25)
    expected = np.mean([t[:, METRICS.index("recall@10")].mean() for t in twin])
    assert oh["table"]["sasrec"]["brief"]["recall@10"]["mean"] == pytest.approx(expected)
    assert _other_history(cfg, {"sasrec": {"none": none}}, {}) is None
