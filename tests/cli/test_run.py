"""Evaluators and benchmarks by name: the registries, and a results.json as a config."""

from __future__ import annotations

import json

import pytest

from recjudge.bench import BENCHMARKS
from recjudge.evaluators import EVALUATORS


@pytest.mark.parametrize("name", EVALUATORS.names())
def test_a_results_json_reruns_its_evaluator_config(tmp_path, name):
    from recjudge.cli._run import _read_config

    spec = EVALUATORS.get(name)
    cfg = spec.config(seed=7, users=3)
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"config": cfg.model_dump(mode="json"), "data": "ml-100k"}))
    back, data = _read_config(str(path), spec.config)
    assert back == cfg and data == "ml-100k"
    plain = tmp_path / "c.json"
    plain.write_text(json.dumps({"seed": 7}))
    assert _read_config(str(plain), spec.config) == (spec.config(seed=7), None)


def test_registries_hold_the_paper_experiments():
    assert set(EVALUATORS.names()) == {"arena", "arena-lists", "gist", "usersum"}
    assert {"brief-ratings", "brief-beta", "brief-offline", "brief-augment"} <= set(
        BENCHMARKS.names()
    )
    for name in BENCHMARKS.names():
        cfg = BENCHMARKS.get(name).config()
        assert type(cfg).model_validate_json(cfg.model_dump_json()) == cfg
        if name.startswith("brief-"):  # --sampling paper is available in every BRIEF bench
            assert hasattr(cfg, "sampling")
