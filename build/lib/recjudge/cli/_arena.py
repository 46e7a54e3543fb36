"""``recjudge arena``: pairwise LLM judging of recommenders."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from recjudge._registry import UnknownNameError
from recjudge.cli._app import app, emit, fail, option_errors

arena_app = typer.Typer(
    help="RecSys Arena: pairwise judging, Q and Bradley-Terry.", no_args_is_help=True
)
app.add_typer(arena_app, name="arena")


@arena_app.command("run")
def arena_run(
    data: str = typer.Option("ml-1m", "--data"),
    systems: str = typer.Option(
        "pop,itemknn,als,sasrec",
        "--systems",
        help="CF model names, name=DIR (saved model) or name=FILE (user_id, rank, item_id lists).",
    ),
    reference: str = typer.Option(
        None,
        "--reference",
        help="The system every other is compared with; default: the first of --systems.",
    ),
    reference_position: str = typer.Option(
        "B",
        "--reference-position",
        help="Where the reference is shown: B (the paper: the system under test in A, the "
        "reference in B) or A.",
    ),
    round_robin: bool = typer.Option(
        False, "--round-robin", help="Every pair in both orders instead (not the paper's)."
    ),
    both_orders: bool = typer.Option(
        False,
        "--both-orders",
        help="Also judge the swapped order; reports swap rules tie and keep beside the paper's.",
    ),
    model: str = typer.Option("qwen2.5-coder-0.5b", "--model"),
    users: int = typer.Option(100, "--users", min=1),
    k: int = typer.Option(5, "--k", min=1),
    history_items: int = typer.Option(5, "--history-items", min=1),
    analysis: str = typer.Option("per-aspect", "--analysis", help="per-aspect or joint."),
    analysis_chars: int = typer.Option(150, "--analysis-chars", min=1),
    swap_rule: str = typer.Option("tie", "--swap-rule", help="Round-robin: tie or keep."),
    absolute: bool = typer.Option(
        False, "--absolute/--no-absolute", help="Also rate each list on 5 levels (not the paper's)."
    ),
    similarity: str = typer.Option("genre", "--similarity", help="URD: genre or embedding."),
    seed: int = typer.Option(0, "--seed"),
    out: str = typer.Option("reports/arena", "--out"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Judge each system against a reference (or every pair); resumable; write report.md,
    results.json, verdicts.jsonl and winrates.png."""
    from pydantic import ValidationError

    from recjudge.evaluators import ArenaConfig, run_arena

    try:
        cfg = ArenaConfig(
            model=model,
            systems=tuple(s.strip() for s in systems.split(",") if s.strip()),
            design="round-robin" if round_robin else "reference",
            reference=reference,
            reference_position=reference_position,
            both_orders=both_orders,
            users=users,
            k=k,
            history_items=history_items,
            analysis=analysis,
            analysis_chars=analysis_chars,
            swap_rule=swap_rule,
            absolute=absolute,
            similarity=similarity,
            seed=seed,
        )
    except ValidationError as e:
        fail(option_errors(e))
    try:
        r = run_arena(cfg, data, out)
    except (UnknownNameError, ValueError) as e:
        fail(str(e))
    if as_json:
        emit({k: v for k, v in r.items() if k != "users"})
        return
    typer.echo((Path(out) / "report.md").read_text())
    typer.echo(f"results in {out}")


@arena_app.command("summarize")
def arena_summarize(
    verdicts: str = typer.Option(
        ..., "--verdicts", help="JSONL: user_id, system_a, system_b, aspect, verdict."
    ),
    auc: str = typer.Option(None, "--auc", help='JSON {"system": auc, ...} for correlations.'),
    bootstrap: int = typer.Option(200, "--bootstrap"),
    seed: int = typer.Option(0, "--seed"),
    reference: str = typer.Option(
        None,
        "--reference",
        help="A system every other one was judged against: adds each system's Q against it, "
        "its order-flip rate and, where records carry p_overall, its order-averaged "
        "probability of beating it.",
    ),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """All aggregates from per-comparison records alone (no model needed)."""
    from recjudge.evaluators import order_stats, summarize

    records = []
    for n, line in enumerate(Path(verdicts).read_text().splitlines(), 1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as e:
                fail(f"{verdicts}, line {n}: not JSON ({e})")
    try:
        auc_map = json.loads(Path(auc).read_text()) if auc else None
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
