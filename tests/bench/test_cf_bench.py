"""``bench cf`` lists every model it is given, saved or trained, on the same protocols."""

from __future__ import annotations

import json

from recjudge.bench import bench_cf
from recjudge.cf_models import TrainOptions, evaluate_sampled, history_at_test, train_cf
from recjudge.data import leave_one_out

OPTS = TrainOptions(progress=False, threads=1)


def test_saved_and_trained_models_share_one_table(tmp_path, ml100k):
    train_cf("sasrec", ml100k, tmp_path / "sas", {"epochs": 1, "hidden": 8, "max_len": 20}, OPTS)
    fm = train_cf("fm", ml100k, tmp_path / "fm", {"epochs": 1, "dim": 4}, OPTS)
    r = bench_cf(
        tmp_path / "sas", "ml-100k", threads=1, out=tmp_path / "rep",
        saved={"fm": str(tmp_path / "fm")}, train=("pop",),
    )  # fmt: skip
    assert list(r["models"]) == ["sasrec", "fm", "pop"]
    split = leave_one_out(ml100k.interactions)
    hist, extra = history_at_test(split)
    want = evaluate_sampled(fm, hist, split.test, extra_seen=extra, seed=0)
    assert r["models"]["fm"]["sampled_hr@10"] == want["hr@10"]
    assert r["models"]["fm"]["config"]["dim"] == 4
    report = (tmp_path / "rep/report.md").read_text()
    assert all(f"| {name} |" in report for name in ("sasrec", "fm", "pop"))
    assert (
        json.loads((tmp_path / "rep/results.json").read_text())["models"].keys()
        == r["models"].keys()
    )
