"""Evaluators and benchmarks by name: the registries, and a results.json as a config."""

from __future__ import annotations

import json

import pytest
import typer

from cli_in_process import run_cli
from recjudge.bench import BENCHMARKS
from recjudge.cli._app import _register_extensions, app
from recjudge.cli._run import _read_config
from recjudge.evaluators import EVALUATORS


@pytest.mark.parametrize("name", EVALUATORS.names())
def test_a_results_json_reruns_its_evaluator_config(tmp_path, name):
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
    assert {"throughput", "latency", "estimator-speed", "gpu-check", "decoding", "cf"} <= set(
        BENCHMARKS.names()
    )  # the performance benchmarks too: one front door for every benchmark
    for name in BENCHMARKS.names():
        cls = BENCHMARKS.get(name).config
        cfg = cls(sasrec="runs/sasrec") if name == "cf" else cls()
        assert type(cfg).model_validate_json(cfg.model_dump_json()) == cfg
        if name.startswith("brief-"):  # --sampling paper is available in every BRIEF bench
            assert hasattr(cfg, "sampling")


def test_a_speed_bench_command_is_its_config_and_reruns_from_results_json(tmp_path):
    """``bench decoding`` from its options, then ``bench run decoding --config results.json``:
    the same config, recorded in results.json (a tiny run: 5 titles, 2 steps)."""
    args = ["--model", "smollm2-135m", "--titles", "5", "--steps", "2", "--repeats", "1"]
    r = run_cli("bench", "decoding", *args, "--batch", "1", "--out", str(tmp_path / "a"))
    assert r.code == 0, r.stderr
    saved = json.loads((tmp_path / "a" / "results.json").read_text())
    assert saved["config"]["titles"] == 5 and saved["config"]["batch"] == 1
    again = run_cli("bench", "run", "decoding", "--config", str(tmp_path / "a" / "results.json"),
                    "--out", str(tmp_path / "b"))  # fmt: skip
    assert again.code == 0, again.stderr
    assert json.loads((tmp_path / "b" / "results.json").read_text())["config"] == saved["config"]
    bad = run_cli("bench", "cf", "--sasrec", "x", "--saved", "fm")
    assert bad.code == 2 and "NAME=DIR" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.parametrize("name", BENCHMARKS.names())
def test_every_bench_command_is_built_from_its_config(name):
    """``recjudge bench NAME`` takes exactly its config's fields (plus --out, --json); a flag
    that is on by default can be turned off."""
    _register_extensions()
    bench = typer.main.get_command(app).commands["bench"]  # type: ignore[attr-defined]
    cmd = bench.commands[name]
    cls = BENCHMARKS.get(name).config
    assert {p.name for p in cmd.params} == set(cls.model_fields) | {"out", "as_json"}
    for p in cmd.params:
        f = cls.model_fields.get(p.name)
        if f is not None and f.default is True:
            assert p.secondary_opts == ["--no-" + p.name.replace("_", "-")]


def test_a_shared_config_may_not_write_outside_the_current_folder(tmp_path):
    """Issue 91: `run evaluate --config results.json` whose out was ../../../../etc/rj_out
    exited 0 and created /etc/rj_out."""
    work = tmp_path / "work"
    work.mkdir()
    cfg = work / "results.json"
    escape = "../../../../../../../../tmp/rj_escape_check"
    cfg.write_text(json.dumps({"job": {"runs": "a=a.jsonl", "feedback": "ml-100k",
                                       "out": escape}}))  # fmt: skip
    r = run_cli("run", "evaluate", "--config", str(cfg), cwd=work)
    assert r.code == 2 and "outside the current folder" in r.stderr
    assert "--out DIR" in r.stderr and "Traceback" not in r.stderr
    assert not (work / escape).resolve().exists()


def test_ray_for_a_single_judgment_is_refused_before_any_cluster_starts():
    """Issue 91: `judge --user 1 --candidate 50 --ray local` started Ray and surfaced its
    start-up timeout as a traceback."""
    r = run_cli("judge", "--user", "1", "--candidate", "50", "--ray", "local")
    assert r.code == 2 and "--ray judges a --pairs file" in r.stderr
    assert "Traceback" not in r.stderr
