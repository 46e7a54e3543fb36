"""The evaluators' commands (``arena run``, ``arena lists``, ``gist run``, ``usersum run``),
built from the registered configs (``recjudge.evaluators.EVALUATORS``) like the jobs' and the
benchmarks': each takes exactly its config's fields as options, plus ``--data``, ``--out`` and
``--json``, so the command, ``recjudge run NAME --config FILE`` and the library accept the same
settings and check them in one place."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from pydantic import BaseModel, ValidationError

from recjudge.cli._app import emit, fail, option_errors
from recjudge.cli._options import command_from_config, flag, text_option


def run_evaluator(name: str, config: BaseModel, data: str, out: str | None, as_json: bool) -> None:
    """Run a registered evaluator on a checked config; print its report (or its JSON view).
    Bad input is one line, never a traceback."""
    from recjudge.cli._jobs import JOB_ERRORS
    from recjudge.evaluators import EVALUATORS

    spec = EVALUATORS.get(name)
    target = out or spec.default_out
    try:
        r = spec.run(config, data, target)
    except ValidationError as e:
        fail(option_errors(e))
    except JOB_ERRORS as e:
        fail(str(e).strip("'\""))
    if as_json:
        emit(spec.view(r))
        return
    typer.echo((Path(target) / "report.md").read_text())
    typer.echo(f"results in {target}")


def evaluator_command(name: str, doc: str) -> Any:
    """A typer command running evaluator ``name``: its config's fields, ``--data``, ``--out``
    (default: the evaluator's report folder) and ``--json``."""
    from recjudge.evaluators import EVALUATORS

    spec = EVALUATORS.get(name)

    def body(config: BaseModel, data: str, out: str | None, as_json: bool) -> None:
        run_evaluator(name, config, data, out, as_json)

    extra = [
        text_option(
            "data",
            "--data",
            "Dataset: a name (ml-1m, ml-100k, bookcrossing) or a saved folder.",
            "ml-1m",
        ),  # fmt: skip
        text_option("out", "--out", f"Report folder (default: {spec.default_out})."),
        flag("as_json", "--json", "Print the results as JSON."),
    ]
    return command_from_config(spec.config, body, doc, name, extra)
