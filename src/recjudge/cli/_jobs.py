"""``recjudge impute / evaluate / augment``, built from the registered job configs
(``recjudge.evaluators.JOBS``): each command's options are its config's fields
(``cli._options``), so the command line, ``recjudge run NAME --config FILE`` and the library
take the same settings and check them in one place."""

from __future__ import annotations

from typing import Any

import typer
from pydantic import BaseModel, ValidationError

from recjudge._registry import UnknownNameError
from recjudge._util import imports_paused
from recjudge.cli._app import app, emit, fail, group, option_errors
from recjudge.cli._options import command_from_config, flag

#: what a job's run may raise for bad input: printed as one line, never a traceback
JOB_ERRORS = (UnknownNameError, KeyError, ValueError, FileNotFoundError, ConnectionError)


def run_job(name: str, job: BaseModel, as_json: bool) -> None:
    """Run a registered job on a checked config and print its results (one-line errors)."""
    from recjudge.evaluators import JOBS  # imported already, by this module's ``_register``

    spec = JOBS.get(name)
    try:
        res = spec.run(job, progress=True, warn=lambda m: typer.echo(m, err=True))
    except ValidationError as e:
        fail(option_errors(e))
    except JOB_ERRORS as e:
        fail(str(e).strip("'\""))
    if as_json:
        emit(res)
        return
    typer.echo(spec.text(job, res))


def _register() -> None:
    # the evaluators, the judge and torch: the start's imports (``imports_paused``)
    with imports_paused(freeze=True):
        from recjudge.evaluators import JOBS

    for name, spec in JOBS.items():
        if not spec.cli_jobs:
            continue

        def body(job: Any, as_json: bool, name: str = name) -> None:
            run_job(name, job, as_json)

        json_flag = flag("as_json", "--json", "Print the results as JSON.")
        words = spec.command or (name,)
        command = command_from_config(spec.config, body, spec.summary, name, [json_flag])
        if len(words) == 1:
            app.command(words[0])(command)
            continue
        group(words[0], f"recjudge {words[0]} ...").command(words[1])(command)


_register()
