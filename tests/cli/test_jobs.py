"""The jobs on the user's files (impute, evaluate, augment): one config each, the command line
built from it, and ``recjudge run NAME --config`` taking the same config."""

from __future__ import annotations

import json

import click
import pytest
import typer

from cli_in_process import run_cli
from recjudge.cli._app import COMMANDS, _register_extensions, app
from recjudge.data import load_from_files
from recjudge.evaluators import JOBS

LOG = "user_id,item_id,timestamp,rating\n" + "".join(
    f"u{u},i{i},{10 * u + i},{1 + (u + i) % 5}\n" for u in range(4) for i in range(8)
)
ITEMS = "item_id,title\n" + "".join(f"i{i},Movie {i} (199{i})\n" for i in range(10))


def _command(name: str) -> click.Command:
    _register_extensions()
    command = typer.main.get_command(app)
    for word in JOBS.get(name).command or (name,):  # `recjudge gold sample`
        command = command.commands[word]  # type: ignore[attr-defined]
    return command


@pytest.mark.parametrize("name", JOBS.names())
def test_every_config_field_is_an_option_and_every_option_a_field(name):
    cls = JOBS.get(name).config
    opts = {p.name for p in _command(name).params if p.name != "as_json"}
    assert opts == set(cls.model_fields)
    for p in _command(name).params:
        if p.name in cls.model_fields:
            assert p.required == cls.model_fields[p.name].is_required()
            assert p.opts == ["--" + p.name.replace("_", "-")]


def test_the_registry_lists_the_jobs():
    assert set(JOBS.names()) == {"impute", "evaluate", "augment", "gold-sample", "judge",
                                 "judge-tune"}  # fmt: skip
    r = run_cli("jobs", "--json")
    assert r.code == 0 and set(json.loads(r.stdout)) == set(JOBS.names())


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    t = tmp_path_factory.mktemp("jobs")
    (t / "log.csv").write_text(LOG)
    (t / "items.csv").write_text(ITEMS)
    load_from_files(t / "log.csv", t / "items.csv", name="toy").save(t / "ds")
    # two systems: one lists the logged items, one items nobody logged
    (t / "a.jsonl").write_text("".join(
        json.dumps({"user_id": f"u{u}", "item_id": f"i{i}", "score": 9 - i}) + "\n"
        for u in range(4) for i in range(3)))  # fmt: skip
    (t / "b.jsonl").write_text("".join(
        json.dumps({"user_id": f"u{u}", "item_id": f"i{i}", "score": 9 - i}) + "\n"
        for u in range(4) for i in (8, 9, 0)))  # fmt: skip
    return t


def test_evaluate_reruns_from_its_results_json(world):
    runs = f"a={world}/a.jsonl,b={world}/b.jsonl"
    args = ["--feedback", f"{world}/ds", "--k", "3", "--metrics", "precision@3,ndcg@3"]
    first = run_cli("evaluate", "--runs", runs, *args, "--out", f"{world}/ev", "--json")
    assert first.code == 0, first.stderr
    saved = json.loads((world / "ev" / "results.json").read_text())
    assert saved["job"]["metrics"] == ["precision@3", "ndcg@3"] and saved["job"]["k"] == 3
    again = run_cli("run", "evaluate", "--config", f"{world}/ev/results.json",
                    "--out", f"{world}/ev2", "--json")  # fmt: skip
    assert again.code == 0, again.stderr
    a, b = json.loads(first.stdout), json.loads(again.stdout)
    assert a["scores"] == b["scores"] and a["users"] == b["users"]
    assert (world / "ev2" / "report.md").exists()


def test_a_bad_value_is_one_line_naming_the_option_on_both_doors(world):
    args = ["--runs", f"{world}/a.jsonl", "--feedback", f"{world}/ds"]
    r = run_cli("evaluate", *args, "--k", "0")
    assert r.code == 2 and "--k" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("evaluate", *args, "--metrics", "ndgc@3", "--k", "3")
    assert r.code == 2 and "ndcg@3" in r.stderr  # the did-you-mean
    cfg = world / "bad.json"
    cfg.write_text(json.dumps({"runs": f"{world}/a.jsonl", "k": 0}))
    r = run_cli("run", "evaluate", "--config", str(cfg))
    assert r.code == 2 and "bad.json" in r.stderr and "k:" in r.stderr


def test_run_names_a_close_job_or_evaluator():
    r = run_cli("run", "imputee")
    assert r.code == 2 and "'impute'" in r.stderr


def test_every_top_level_command_names_its_module():
    """A run imports only its command's module (a faster cold start): the map must cover
    every command, or that command would be missing when called alone."""
    _register_extensions()
    names = set(typer.main.get_command(app).commands)  # type: ignore[attr-defined]
    assert names == set(COMMANDS)


def test_judge_is_a_job_the_command_line_and_run_config_judge_alike(world, tmp_path):
    """``recjudge judge --pairs`` and ``recjudge run judge --config FILE`` read one config
    (``JudgeJob``): the same pairs under the same keys with the same verdicts, and the
    ``--json`` counts add up to the file's pairs."""
    pairs = tmp_path / "p.jsonl"
    pairs.write_text('{"user_id": "u0", "item_id": "i9"}\n{"user_id": "u1", "item_id": "i8"}\n')
    common = {"data": f"{world}/ds", "pairs": str(pairs), "mode": "zero-shot",
              "no_evidence": True, "max_history": 4}  # fmt: skip
    r = run_cli(
        "judge",
        "--data",
        common["data"],
        "--pairs",
        str(pairs),
        "--mode",
        "zero-shot",
        "--no-evidence",
        "--max-history",
        "4",
        "--out",
        f"{tmp_path}/a.jsonl",
        "--json",
    )
    assert r.code == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["pairs"] == 2 and got["judged"] + got["failed"] == 2 and got["reused"] == 0
    cfg = tmp_path / "judge.json"
    cfg.write_text(json.dumps(common))
    r = run_cli("run", "judge", "--config", str(cfg), "--out", f"{tmp_path}/b.jsonl")
    assert r.code == 0, r.stderr
    # a shared config decides where the store lands only below the current folder
    cfg.write_text(json.dumps({**common, "store": "/tmp/elsewhere.sqlite"}))
    r = run_cli("run", "judge", "--config", str(cfg), "--out", f"{tmp_path}/c.jsonl")
    assert r.code == 2 and "its store" in r.stderr and "--store" in r.stderr

    def read(name: str) -> list[tuple]:
        rows = [json.loads(x) for x in (tmp_path / name).read_text().splitlines()]
        return [(x["key"], x["candidate_id"], x["is_relevant"]) for x in rows]

    assert read("a.jsonl") == read("b.jsonl") and len(read("a.jsonl")) == 2
