"""``recjudge store``: carry a run's finished work to another machine without its texts."""

from __future__ import annotations

from dataclasses import asdict

import typer

from recjudge.cli._app import app, emit, emit_kv

store_app = typer.Typer(
    help="Results stores: title-free checkpoints to resume a run on another machine.",
    no_args_is_help=True,
)
app.add_typer(store_app, name="store")


@store_app.command("export")
def store_export(
    store: str = typer.Argument(..., help="A run's results store (e.g. OUT/store.sqlite)."),
    out: str = typer.Option(..., "--out", help="The checkpoint to write (gzip JSON lines)."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Write a store's title-free rows (no request, history, title or id) to a checkpoint."""
    # Read-out judgments without their ids and the decision records beside the store: the
    # file can be kept where the dataset's text may not (MovieLens forbids redistribution).
    from recjudge.reward import export_portable

    n = export_portable(store, out)
    if as_json:
        emit(asdict(n) | {"out": out})
        return
    emit_kv({"judgments": n.results, "decisions": n.decisions, "left out": n.left_out,
             "written to": out})  # fmt: skip
    if n.left_out:
        typer.echo("(rows left out hold item text in their answers; a resumed run judges them)")


@store_app.command("import")
def store_import(
    checkpoint: str = typer.Argument(..., help="A file `recjudge store export` wrote."),
    into: str = typer.Option(..., "--into", help="The results store to add the rows to."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Add a checkpoint's rows to a store; the same run then reads them instead of judging."""
    # The store is created if missing; keys it already has are kept as they are.
    from recjudge.reward import import_portable

    n = import_portable(checkpoint, into)
    if as_json:
        emit(asdict(n) | {"into": into})
        return
    emit_kv({"judgments": n.results, "decisions": n.decisions, "already present": n.present,
             "store": into})  # fmt: skip
