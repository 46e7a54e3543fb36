"""``recjudge store``: carry a run's finished work to another machine without its texts."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import typer

from recjudge.cli._app import app, emit, emit_kv, fail

store_app = typer.Typer(
    help="Results stores: title-free checkpoints to resume a run on another machine.",
    no_args_is_help=True,
)
app.add_typer(store_app, name="store")


@store_app.command("export")
def store_export(
    store: str = typer.Argument(..., help="A run's results store (e.g. OUT/store.sqlite)."),
    out: str = typer.Option(..., "--out", help="The checkpoint to write (gzip JSON lines)."),
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON."),
) -> None:
    """Write a store's title-free rows (no request, history, title or id) to a checkpoint."""
    # Read-out judgments without their ids and the decision records beside the store: the
    # file can be kept where the dataset's text may not (MovieLens forbids redistribution).
    from recjudge.reward import export_portable

    n = export_portable(store, out)
    if as_json:
        emit(asdict(n) | {"out": out})
        return
    emit_kv({"judgments": n.results, "decisions": n.decisions, "personas": n.personas,
             "left out": n.left_out, "written to": out})  # fmt: skip
    if n.left_out:
        typer.echo(
            "(rows left out hold item text in their answers, or are free text without a "
            "title-free form; a resumed run asks them again)"
        )


@store_app.command("import")
def store_import(
    checkpoint: str = typer.Argument(..., help="A file `recjudge store export` wrote."),
    into: str = typer.Option(..., "--into", help="The results store to add the rows to."),
    trust_unsigned: bool = typer.Option(
        False,
        "--trust-unsigned",
        help="Import a file whose manifest is missing or does not match (an old version-1 "
        "file, or one edited after export). Only for files you know the origin of.",
    ),
    max_size: int = typer.Option(
        512, "--max-size", min=1, help="MB a checkpoint may inflate to (refused beyond)."
    ),
    repair: bool = typer.Option(
        False, "--repair", help="Salvage a damaged --into store's readable rows first."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON."),
) -> None:
    """Add a checkpoint's rows to a store; the same run then reads them instead of judging.

    The file is checked whole first (digest, row counts, the shape of every row, its size
    inflated; with $RECJUDGE_CHECKPOINT_KEY set, its signature): a file that fails is refused
    and nothing is imported.
    """
    # The store is created if missing; keys it already has are kept as they are.
    from recjudge.reward import PortableError, StoreError, import_portable

    if repair and Path(into).exists():
        from recjudge.reward import repair_store

        typer.echo(repair_store(Path(into)))
    try:
        n = import_portable(
            checkpoint, into, trust_unsigned=trust_unsigned, max_inflated=max_size * 2**20
        )
    except (PortableError, StoreError) as e:
        fail(str(e))
    if as_json:
        emit(asdict(n) | {"into": into})
        return
    emit_kv({"judgments": n.results, "decisions": n.decisions, "personas": n.personas,
             "already present": n.present, "conflicting": n.conflicts, "verified": n.verified,
             "store": into})  # fmt: skip
    if n.conflicts:
        typer.echo(
            f"({n.conflicts} rows of the checkpoint differ from the answers the store already "
            "holds under the same keys; the store's are kept)"
        )
    if n.verified == "unverified":
        typer.echo("(imported without a verified manifest: --trust-unsigned)")


@store_app.command("reseal")
def store_reseal(
    checkpoint: str = typer.Argument(..., help="A checkpoint (e.g. an old version-1 file)."),
    out: str = typer.Option(..., "--out", help="The checkpoint to write."),
    trust_unsigned: bool = typer.Option(
        False, "--trust-unsigned", help="Needed for a file whose manifest does not verify."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON."),
) -> None:
    """Write a checkpoint again with a current manifest (digest; signed with
    $RECJUDGE_CHECKPOINT_KEY when set), after checking every row."""
    from recjudge.reward import PortableError, reseal_portable

    try:
        n = reseal_portable(checkpoint, out, trust_unsigned=trust_unsigned)
    except PortableError as e:
        fail(str(e))
    if as_json:
        emit(asdict(n) | {"out": out})
        return
    emit_kv({"judgments": n.results, "decisions": n.decisions, "personas": n.personas,
             "read as": n.verified, "written to": out})  # fmt: skip
