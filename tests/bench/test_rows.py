"""``bench decode-rows``: the same GISTBench extraction questions under each rows setting."""

from __future__ import annotations

import json
import math

import pytest
from pydantic import ValidationError

from recjudge.bench import BENCHMARKS, DecodeRowsConfig, bench_decode_rows
from recjudge.evaluators import GistConfig, gist_extraction_asks


def test_config_round_trip_and_validation():
    cfg = DecodeRowsConfig(model="m", users=3, rows=(1, 4, 8), repeats=2)
    assert DecodeRowsConfig.model_validate_json(cfg.model_dump_json()) == cfg
    for bad in ((), (1, 1), (0, 8)):
        with pytest.raises(ValidationError, match="distinct positive"):
            DecodeRowsConfig(rows=bad)
    assert BENCHMARKS.get("decode-rows").config is DecodeRowsConfig


def test_extraction_asks_cover_every_chunk_of_every_sampled_user(ml100k):
    cfg = GistConfig(models=("a", "b"), judge="a", users=3, max_history=12, chunk_size=5)
    asks = gist_extraction_asks(cfg, "ml-100k")
    lengths = ml100k.interactions.groupby("user_id", observed=True).size()
    users = {a.request["user_id"] for a in asks}
    assert len(users) == 3
    chunks = sum(math.ceil(min(12, int(lengths[u])) / 5) for u in users)
    assert len(asks) == 2 * chunks  # both models
    assert len({a.key for a in asks}) == len(asks)  # a key per (model, user, chunk)


@pytest.mark.e2e
def test_bench_times_each_setting_on_the_same_questions(smollm, tmp_path):
    cfg = DecodeRowsConfig(
        model="smollm2-135m",
        data="ml-100k",
        users=2,
        max_history=10,
        chunk_size=5,
        extraction_tokens=20,  # the bench's bookkeeping is under test, not long answers
        rows=(1, 2),
        threads=1,
    )
    r = bench_decode_rows(cfg, tmp_path / "rep", llm=smollm, progress=False)
    assert r["questions"] == 4
    one, two = r["settings"]["1"], r["settings"]["2"]
    assert one["identical_to_first"] == 4  # the first setting against itself
    assert 0 <= two["identical_to_first"] <= 4
    for s in (one, two):
        assert s["seconds"] > 0 and s["generated_tokens"] > 0
        assert math.isclose(s["answers_per_s"], 4 / s["seconds"])
    assert math.isclose(r["ratios"]["rows 2 vs 1"], two["answers_per_s"] / one["answers_per_s"])
    saved = json.loads((tmp_path / "rep/results.json").read_text())
    assert DecodeRowsConfig.model_validate(saved["config"]) == cfg
    report = (tmp_path / "rep/report.md").read_text()
    assert "| 1 |" in report and "| 2 |" in report and "rows 2 vs 1" in report
