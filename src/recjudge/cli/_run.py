"""``recjudge run NAME`` and ``recjudge bench run NAME``: an evaluator or benchmark from a
saved config, dispatched through the registries (so a results.json reruns its experiment)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from pydantic import ValidationError

from recjudge._registry import suggest
from recjudge._util import json_loads, os_error_line
from recjudge.bench import BENCHMARKS
from recjudge.cli._app import app, emit, fail, option_errors
from recjudge.cli._bench import bench_app, run_bench
from recjudge.cli._evaluators import run_evaluator
from recjudge.cli._jobs import run_job
from recjudge.evaluators import EVALUATORS, JOBS

CONFIG_HELP = (
    "A JSON file with the config (the 'config' of a results.json also works); options not in "
    "it keep their defaults."
)


def _read_config(
    path: str | None, cls: Any, overrides: dict[str, Any] | None = None
) -> tuple[Any, str | None]:
    """(config, the data name a results.json records) from a JSON file (a results.json: its
    ``job``, else its ``config``), with ``overrides`` (the command line's) on top; defaults
    if None."""
    raw: dict[str, Any] = {}
    data = None
    if path:
        try:
            raw = json_loads(Path(path).read_text())
        except FileNotFoundError:
            fail(f"{path}: no such file; pass --config a JSON file (e.g. a report's results.json)")
        except json.JSONDecodeError as e:
            fail(f"{path}: not JSON ({e.msg}, line {e.lineno}); fix the file or omit --config")
        except UnicodeDecodeError:
            fail(f"{path}: not UTF-8 text; --config takes a JSON file (e.g. a report's "
                 "results.json)")  # fmt: skip
        except OSError as e:
            fail(f"--config {os_error_line(e)}")
        if not isinstance(raw, dict):
            fail(f"{path}: expected a JSON object with the config's fields")
        for key in ("job", "config"):  # a results.json
            if isinstance(raw.get(key), dict):
                data = raw.get("data")
                raw = raw[key]
                break
    _check_outputs(raw, path, overrides or {})
    raw = {**raw, **(overrides or {})}
    try:
        return cls.model_validate(raw), data
    except ValidationError as e:
        where = f"{path}: " if path else ""
        fail(f"{where}{option_errors(e).replace('--', '')}")
    raise AssertionError  # fail() exits


def _check_outputs(raw: dict[str, Any], path: str | None, overrides: dict[str, Any]) -> None:
    """Refuse an output folder a shared config file sets outside the current folder (a
    results.json from someone else decides where files land only inside it); one the user
    passes on the command line is theirs to choose."""
    here = Path.cwd().resolve()
    for key, value in raw.items():
        # (``store``: where ``judge`` writes its results store, beside ``out`` by default)
        if not (key in ("out", "store") or key.endswith("_out")) or key in overrides:
            continue
        if not isinstance(value, str) or not value:
            continue
        target = (here / value).resolve()
        if target != here and here not in target.parents:
            fix = (
                f"pass --{key.replace('_', '-')} DIR on the command line"
                if key != "store"
                else "give --store on the job's own command line (`recjudge judge`)"
            )
            fail(f"{path}: its {key} {value!r} is outside the current folder ({here}); a "
                 f"config file may only write below it: {fix} to write elsewhere")  # fmt: skip


def _list(registry: Any, as_json: bool) -> None:
    rows = {n: s.summary for n, s in registry.items()}
    if as_json:
        emit(rows)
        return
    for n, s in rows.items():
        typer.echo(f"{n:<25} {s}")


@app.command("evaluators")
def evaluators_list(
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON."),
) -> None:
    """List the evaluators ``recjudge run`` can run."""
    _list(EVALUATORS, as_json)


@app.command("jobs")
def jobs_list(
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON."),
) -> None:
    """List the jobs on your files (``recjudge NAME`` or ``recjudge run NAME --config``)."""
    _list(JOBS, as_json)


@app.command("run")
def run_cmd(
    name: str = typer.Argument(
        ..., help="An evaluator or a job: see `recjudge evaluators`, `recjudge jobs`."
    ),  # fmt: skip
    config: str = typer.Option(None, "--config", help=CONFIG_HELP),
    data: str = typer.Option(
        None, "--data", help="Dataset (default: the config file's, or ml-1m)."
    ),
    out: str = typer.Option(None, "--out", help="Report folder (default: the evaluator's)."),
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON."),
) -> None:
    """Run an evaluator or a job by name from a saved config (resumable, like its own
    command)."""
    if name in JOBS:
        cls = JOBS.get(name).config
        given = {"data": data, "out": out}
        job, _ = _read_config(
            config, cls, {k: v for k, v in given.items() if v is not None and k in cls.model_fields}
        )
        run_job(name, job, as_json)
        return
    if name not in EVALUATORS:
        known = [*EVALUATORS, *JOBS]
        close = suggest(name, known)
        hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        fail(f"unknown evaluator or job {name!r}.{hint} Known: {', '.join(sorted(known))}.")

    cfg, saved_data = _read_config(config, EVALUATORS.get(name).config)
    run_evaluator(name, cfg, data or saved_data or "ml-1m", out, as_json)


@bench_app.command("list")
def bench_list(
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON."),
) -> None:
    """List the benchmarks ``recjudge bench run`` can run from a config."""
    _list(BENCHMARKS, as_json)


@bench_app.command("run")
def bench_run_cmd(
    name: str = typer.Argument(..., help="A benchmark: see `recjudge bench list`."),
    config: str = typer.Option(None, "--config", help=CONFIG_HELP),
    out: str = typer.Option(None, "--out", help="Default: reports/<name>/<data>-<model>."),
) -> None:
    """Run a benchmark by name from a saved config (e.g. a report's results.json)."""
    spec = BENCHMARKS.get(name)
    cfg, _ = _read_config(config, spec.config)
    run_bench(name, cfg, out)
