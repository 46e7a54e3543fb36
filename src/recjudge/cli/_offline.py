"""``recjudge calibrate / audit``: the judge against labels, and its biases (impute,
evaluate and augment are built from their job configs in ``cli._jobs``)."""

from __future__ import annotations

import typer

from recjudge.cli._app import app, emit, fail


@app.command("calibrate")
def calibrate_cmd(
    judgments: str = typer.Option(
        ..., "--judgments", help="An impute --out folder (imputed.jsonl and summary.json)."
    ),
    labels: str = typer.Option(
        ..., "--labels", help="Labelled pairs: CSV/JSONL with user_id, item_id, label (0/1)."
    ),
    out: str = typer.Option(..., "--out", help="Folder: calibration.json, report.md, PNG."),
    folds: int = typer.Option(5, "--folds", min=2, help="Folds of the cross-fitted check."),
    seed: int = typer.Option(0, "--seed", help="Seed of the fold assignment."),
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON."),
) -> None:
    """The judge against labels you trust: AUC, Brier, ECE, kappa, a reliability diagram,
    and an isotonic map (p_yes -> P(relevant)) that impute --calibration applies."""
    from recjudge.data import DataError
    from recjudge.evaluators import calibration_lines, run_calibration

    try:
        res = run_calibration(judgments, labels, out, folds=folds, seed=seed)
    except (DataError, ValueError) as e:
        fail(str(e))
    if as_json:
        emit({k: v for k, v in res.items() if k not in ("map",)})
        return
    typer.echo("\n".join(calibration_lines(res)))


@app.command("audit")
def audit_cmd(
    judgments: str = typer.Option(
        None, "--judgments", help="An impute --out folder (imputed.jsonl and summary.json)."
    ),
    data: str = typer.Option(None, "--data", help="The dataset the judge read (histories)."),
    arena: str = typer.Option(
        None,
        "--arena",
        help="Instead: a RecSys Arena run folder (verdicts.jsonl): verdicts by list position "
        "per aspect, order-flip rates, and each system's wins in A and in B.",
    ),
    out: str = typer.Option(..., "--out", help="Folder: report.md, results.json, audit.png."),
    labels: str = typer.Option(
        None, "--labels", help="Optional labelled pairs (user_id,item_id,label) for the gaps."
    ),
    bins: int = typer.Option(10, "--bins", min=2, max=50, help="Quantile bins per factor."),
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON."),
) -> None:
    """Bias audit of a judgments file: YES rate and calibration by item popularity,
    history length and title length (table + PNG); or of an arena run: verdicts by list
    position."""
    from recjudge.data import DataError
    from recjudge.evaluators import run_audit, run_position_audit

    if arena:
        if judgments or labels:
            fail("--arena audits an arena run on its own: drop --judgments/--labels")
    elif not (judgments and data):
        fail("give --judgments DIR and --data DATA (an impute run), or --arena DIR")
    try:
        res, lines = (
            run_position_audit(arena, out)
            if arena
            else run_audit(judgments, data, out, labels, bins)
        )
    except (DataError, ValueError, KeyError) as e:
        fail(str(e).strip("'\""))
    if as_json:
        emit(res)
        return
    typer.echo("\n".join(lines))
