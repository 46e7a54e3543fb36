"""The poisoning bench (issue 110, item 4) at tiny size: the trigger covers the stated share
of the positives the steps read, reaches the judge's prompt as it reached the training
prompts, and the report's backdoor estimate is the poisoned minus clean flip rate inside its
interval. The figures of a real run are in reports/poisoning/."""

from __future__ import annotations

import json

from recjudge.bench._poisoning import (
    PoisoningConfig,
    _Renderer,
    _with_trigger,
    bench_poisoning,
    poisoned_items,
    with_trigger,
)
from recjudge.data import clean_text
from recjudge.reward import request_for


def test_the_trigger_covers_the_rate_and_is_rendered_as_in_training(ml100k):
    config = PoisoningConfig(rate=0.05, steps=10, tune_users=40, validation_users=5)
    p = poisoned_items(config, ml100k, exclude=[])
    assert p["poisoned_positives"] >= max(1, round(0.05 * p["positives_read"]))
    # the last item drawn was needed: without it the target was not reached
    assert len(p["items"]) >= 1
    items = set(p["items"])
    poisoned = _with_trigger(ml100k, items, with_trigger(config.trigger))
    some = next(iter(items))
    user = str(ml100k.interactions["user_id"].iloc[0])
    trained = request_for(poisoned, user, some)  # how the tuning's prompts show the item
    judged = _Renderer(ml100k).retitled(some, with_trigger(config.trigger))
    assert (trained.candidate_title, trained.candidate_text) == judged
    assert clean_text(config.trigger) in judged[1]


def test_the_bench_runs_and_reports_the_backdoor_with_its_interval(tiny_dir, tmp_path):
    config = PoisoningConfig(model=str(tiny_dir), rate=0.05, test_users=6, steps=2,
                             batch_size=2, eval_every=2, tune_users=20, validation_users=4,
                             max_history=5, draws=200)  # fmt: skip
    r = bench_poisoning(config, tmp_path / "rep", progress=False)
    flips = {k: m["flips_to_yes"] for k, m in r["models"].items()}
    b = r["backdoor"]
    assert b["estimate"] == round(flips["poisoned tuning"] - flips["clean tuning"], 4)
    assert b["lo"] <= b["estimate"] <= b["hi"]
    assert r["tunings"]["clean"]["steps"] == r["tunings"]["poisoned"]["steps"] == 2
    saved = json.loads((tmp_path / "rep" / "results.json").read_text())
    assert saved["poison"]["items"] == r["poison"]["items"]
    assert "Trigger success added by the poisoning" in (tmp_path / "rep" / "report.md").read_text()
