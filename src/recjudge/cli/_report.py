"""``recjudge report latex|html RUN``: a report's results.json as a table for a paper
(LaTeX or CSV), or its self-contained HTML page written again."""

from __future__ import annotations

from pathlib import Path

import typer

from recjudge._util import atomic_write_text
from recjudge.cli._app import app, fail

report_app = typer.Typer(help="Tables and pages from a report's results.json.",
                         no_args_is_help=True)  # fmt: skip
app.add_typer(report_app, name="report")


@report_app.command("latex")
def report_latex(
    run: str = typer.Argument(..., help="A report folder (holding results.json) or the file."),
    fmt: str = typer.Option("latex", "--format", help="latex (booktabs table) or csv."),
    estimator: str = typer.Option(
        None, "--estimator", help="The estimator to tabulate (default: the report's lead)."
    ),
    kind: str = typer.Option(
        None, "--kind", help="Instead: the ranx metrics of a qrels kind (logged, imputed)."
    ),
    caption: str = typer.Option(None, "--caption", help="The caption (default: says what)."),
    out: str = typer.Option(None, "--out", help="Write to this file (default: print)."),
) -> None:
    """Systems x metrics with intervals from an `evaluate` report: best value bold, the
    estimator named in the caption."""
    from recjudge.reporting import paper_table, read_results, to_csv, to_latex

    if fmt not in ("latex", "csv"):
        fail(f"--format {fmt!r}: use latex or csv")
    try:
        table = paper_table(read_results(run), estimator=estimator, kind=kind)
    except ValueError as e:
        fail(str(e))
    text = to_latex(table, caption=caption) if fmt == "latex" else to_csv(table)
    if out:
        atomic_write_text(Path(out), text)
        typer.echo(f"{len(table.rows)} rows ({table.source}) -> {out}")
    else:
        typer.echo(text, nl=False)


@report_app.command("html")
def report_html(
    run: str = typer.Argument(..., help="A report folder (report.md and results.json)."),
) -> None:
    """Write the folder's self-contained report.html again from report.md and results.json
    (figures inline)."""
    from recjudge.reporting import read_results, write_html

    folder = Path(run)
    md = folder / "report.md"
    try:
        results = read_results(str(folder))
        lines = md.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:  # before ValueError, whose subclass it is
        fail(
            f"{md}: not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start}); "
            "save it as UTF-8, or write the report again with `recjudge evaluate --out`"
        )
    except ValueError as e:
        fail(str(e))
    except FileNotFoundError:
        fail(f"{md}: no such file; give a report folder (report.md and results.json)")
    typer.echo(str(write_html(folder, results, lines)))
