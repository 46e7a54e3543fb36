"""``recjudge bench``: benchmarks that write reports/<name>/ (report.md + results.json)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from recjudge.bench import BENCHMARKS
from recjudge.cli._app import app, emit, fail
from recjudge.cli._jobs import JOB_ERRORS
from recjudge.cli._options import command_from_config, flag, text_option

bench_app = typer.Typer(help="Benchmarks and experiments that write reports.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")


def run_bench(name: str, config: Any, out: str | None, as_json: bool = False) -> None:
    """Run a registered benchmark on a checked config and print what it prints (one-line
    errors for bad input)."""
    spec = BENCHMARKS.get(name)
    target = out or spec.out_for(name, config)
    try:
        r = spec.run(config, target)
    except JOB_ERRORS as e:
        fail(str(e).strip("'\""))
    if as_json:
        emit(spec.json_view(r) if spec.json_view else r)
    elif spec.text is None:
        typer.echo((Path(target) / "report.md").read_text())
    else:
        typer.echo(spec.text(r))
        typer.echo(f"report: {Path(target) / 'report.md'}")


def _register() -> None:
    """``recjudge bench NAME`` for every registered benchmark, its options its config's
    fields (``cli._options``) plus ``--out`` and ``--json``."""
    for name, spec in BENCHMARKS.items():

        def body(config: Any, out: str | None, as_json: bool, name: str = name) -> None:
            run_bench(name, config, out, as_json)

        extra = [
            text_option("out", "--out", f"Report folder (default: reports/{name}/...)."),
            flag("as_json", "--json", "Print the results as JSON."),
        ]
        doc = (spec.config.__doc__ or "").split("\n\n")[0].split(": ", 1)[-1]
        bench_app.command(name)(command_from_config(spec.config, body, f"{spec.summary}. {doc}",
                                                    f"bench-{name}", extra))  # fmt: skip


_register()
