"""``recjudge arena``: pairwise LLM judging of recommenders."""

from __future__ import annotations

import json
import math
from pathlib import Path

import typer

from recjudge._util import json_loads
from recjudge.cli._app import app, emit, fail
from recjudge.cli._evaluators import evaluator_command

arena_app = typer.Typer(
    help="RecSys Arena: pairwise judging, Q and Bradley-Terry.", no_args_is_help=True
)
app.add_typer(arena_app, name="arena")


arena_app.command("run")(evaluator_command(
    "arena",
    "Judge each system against a reference (or every pair); resumable; write report.md, "
    "results.json, verdicts.jsonl and winrates.png.",
))  # fmt: skip
arena_app.command("lists")(evaluator_command(
    "arena-lists",
    "List-level arena (our extension): every listed item is one BRIEF read-out, each list "
    "scored by its discounted mean P(YES); Q per system with CIs, rank agreement with AUC.",
))  # fmt: skip


def _auc_map(path: str) -> dict[str, float]:
    """``--auc``'s JSON object of system -> finite AUC (one line naming the bad entry)."""
    try:
        got = json_loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        fail(f"--auc {path}: not a readable JSON file ({type(e).__name__}); write "
             '{"system": auc, ...}')  # fmt: skip
    if not isinstance(got, dict):
        fail(f'--auc {path}: expected a JSON object {{"system": auc, ...}}')
    out = {}
    for name, v in got.items():
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            fail(f"--auc {path}: {name!r} has {v!r}, not a finite number; give each system's "
                 "AUC as a number (or leave the system out)")  # fmt: skip
        out[str(name)] = float(v)
    return out


@arena_app.command("summarize")
def arena_summarize(
    verdicts: str = typer.Option(
        ..., "--verdicts", help="JSONL: user_id, system_a, system_b, aspect, verdict."
    ),
    auc: str = typer.Option(None, "--auc", help='JSON {"system": auc, ...} for correlations.'),
    bootstrap: int = typer.Option(200, "--bootstrap", help="Bradley-Terry bootstrap resamples."),
    seed: int = typer.Option(0, "--seed", help="Bootstrap seed."),
    reference: str = typer.Option(
        None,
        "--reference",
        help="A system every other one was judged against: adds each system's Q against it, "
        "its order-flip rate and, where records carry p_overall, its order-averaged "
        "probability of beating it.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON."),
) -> None:
    """All aggregates from per-comparison records alone (no model needed)."""
    from recjudge.data import DataError
    from recjudge.evaluators import order_stats, summarize
    from recjudge.evaluators.offline import verdict_records

    try:
        records, repeats = verdict_records(verdicts, "give a JSONL file of user_id, system_a, "
                                           "system_b, aspect, verdict records")  # fmt: skip
    except DataError as e:
        fail(str(e))
    if repeats:
        typer.echo(f"{verdicts}: {repeats} repeated record(s) counted once", err=True)
    auc_map = _auc_map(auc) if auc else None
    try:
        s = summarize(records, auc_map, bootstrap, seed, reference=reference)
        s |= order_stats(records, reference, auc_map, bootstrap, seed)
    except ValueError as e:
        fail(f"{verdicts}: {e}")
    if as_json:
        emit(s)
        return
    for pair, c in s["pairs"]["overall"].items():
        typer.echo(
            f"{pair:<24} win {c['win']:>4} tie {c['tie']:>4} lose {c['lose']:>4} q {c['q']:.3f}"
        )
    typer.echo("Bradley-Terry:")
    for sys_, v in s["bradley_terry"].items():
        typer.echo(f"  {sys_:<12} {v['strength']:+.3f}  CI {v['ci95']}")
    if s["order_flip_rate"] is not None:
        typer.echo(f"order-flip rate: {100 * s['order_flip_rate']:.1f} % of pairs in both orders")
    for sys_, c in s.get("reference_q", {}).get("overall", {}).items():
        flip = s["order_flip_by_system"].get(sys_)
        avg = s.get("order_averaged", {}).get(sys_)
        typer.echo(
            f"  vs {reference}: {sys_:<12} q {c['q']:.3f} (every order in the file)"
            + (f"  flip {100 * flip:.1f} %" if flip is not None else "")
            + (f"  P(beats {reference}, order-averaged) {avg:.4f}" if avg is not None else "")
        )
