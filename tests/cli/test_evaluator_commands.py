"""The evaluators' commands (``arena run``, ``arena lists``, ``gist run``, ``usersum run``,
``gist verify``) are built from the registered configs: their options are the config's fields,
parsed by the config's own validators, like the jobs' and the benchmarks'."""

from __future__ import annotations

import click
import pytest
import typer

import recjudge.cli._evaluators as ev
from cli_in_process import run_cli
from recjudge.cli._app import _register_extensions, app
from recjudge.cli._gist import EXTRACTION_FIELDS
from recjudge.cli._reference import commands
from recjudge.evaluators import EVALUATORS, GistConfig

#: evaluator -> (command group, command)
COMMANDS = {
    "arena": ("arena", "run"),
    "arena-lists": ("arena", "lists"),
    "gist": ("gist", "run"),
    "usersum": ("usersum", "run"),
}


def _command(*path: str) -> click.Command:
    _register_extensions()
    cmd = typer.main.get_command(app)
    for name in path:
        cmd = cmd.commands[name]  # type: ignore[attr-defined]
    return cmd


def test_every_evaluator_has_a_command():
    assert set(COMMANDS) == set(EVALUATORS.names())


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_an_evaluators_options_are_its_configs_fields_with_its_defaults(name):
    cls = EVALUATORS.get(name).config
    cmd = _command(*COMMANDS[name])
    assert {p.name for p in cmd.params} == set(cls.model_fields) | {"data", "out", "as_json"}
    for p in cmd.params:
        f = cls.model_fields.get(p.name)
        if f is None:
            continue
        assert ("--" + p.name.replace("_", "-")) in p.opts
        if isinstance(f.default, tuple):
            assert p.default == ",".join(map(str, f.default))
        elif not hasattr(f.default, "model_dump"):
            assert p.default == f.default, p.name


def test_gist_verify_takes_the_verification_settings_not_the_extraction_ones():
    cmd = _command("gist", "verify")
    names = {p.name for p in cmd.params}
    assert names == (set(GistConfig.model_fields) - set(EXTRACTION_FIELDS)) | {
        "data", "profiles", "oracle", "out", "users", "as_json"}  # fmt: skip
    assert {"predicate", "taxonomy", "options", "deterministic"} <= names


def test_every_option_of_every_command_says_what_it_does():
    """A user reads --help: an option without a line of help is a field nobody documented.
    Every command and group (``judge`` has options of its own), read as the docs' CLI
    reference reads them (typer's parameters are not ``click.Option`` instances)."""
    table = commands()
    missing = [
        " ".join(path) + " " + o.names[0]
        for path, doc in table.items()
        for o in doc.options
        if o.names and not o.help
    ]
    assert not missing, missing
    assert sum(len(d.options) for d in table.values()) > 300  # the walk saw the commands


@pytest.fixture
def captured(monkeypatch):
    """The config each evaluator command builds (nothing is judged)."""
    seen: dict = {}

    def fake(name, config, data, out, as_json):
        seen.update(name=name, config=config, data=data, out=out)

    monkeypatch.setattr(ev, "run_evaluator", fake)
    return seen


def test_lists_nested_configs_none_and_old_names_reach_the_config(captured):
    r = run_cli("gist", "run", "--models", "a, b", "--predicate", '{"imp_pos": 2}',
                "--example", "noir", "--words", "1,4", "--max-history", "30")  # fmt: skip
    assert r.code == 0, r.stderr
    cfg = captured["config"]
    assert cfg.models == ("a", "b") and cfg.predicate.imp_pos == 2 and cfg.words == (1, 4)
    assert cfg.interest_example == "noir" and cfg.max_history == 30
    assert cfg.predicate.exp_pos == GistConfig().predicate.exp_pos  # the rest keep defaults
    assert captured["data"] == "ml-1m" and captured["out"] is None

    r = run_cli("arena", "run", "--history-min-rating", "none", "--design", "round-robin")
    assert r.code == 0, r.stderr
    assert captured["config"].history_min_rating is None
    assert captured["config"].design == "round-robin"
    r = run_cli("arena", "run", "--history-min-rating", "3.5", "--data", "ml-100k")
    assert r.code == 0 and captured["config"].history_min_rating == 3.5
    assert captured["data"] == "ml-100k"

    r = run_cli("usersum", "run", "--summarizer", "hierarchy")
    assert r.code == 0, r.stderr
    assert captured["config"].summarizers == ("hierarchy",)


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["gist", "run", "--predicate", "{imp_pos: 2}"], ["--predicate", "not JSON", "imp_pos"]),
        (["gist", "run", "--predicate", '{"imp_pos": 0}'], ["--predicate", "imp_pos"]),
        (["usersum", "run", "--summarizer", "single,tree"], ["--summarizers", "hierarchy"]),
        (["arena", "run", "--design", "pairs"], ["--design", "round-robin"]),
        (["arena", "run", "--history-min-rating", "high"], ["--history-min-rating"]),
        (["arena", "lists", "--systems", "pop"], ["at least two"]),
    ],
)
def test_a_bad_value_is_one_line_naming_the_option(captured, argv, words):
    r = run_cli(*argv)
    assert r.code == 2 and "Traceback" not in r.stderr and not captured
    text = " ".join(r.stderr.split())
    for w in words:
        assert w in text, (w, r.stderr)
