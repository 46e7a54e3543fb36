"""``recjudge gist``: GISTBench interest groundedness and specificity."""

from __future__ import annotations

from pathlib import Path

import typer

from recjudge._registry import UnknownNameError
from recjudge.cli._app import app, emit, fail

gist_app = typer.Typer(
    help="GISTBench: interest extraction, groundedness (IG) and specificity (IS).",
    no_args_is_help=True,
)
app.add_typer(gist_app, name="gist")


@gist_app.command("run")
def gist_run(
    data: str = typer.Option("ml-1m", "--data"),
    models: str = typer.Option(
        "smollm2-135m", "--models", help="Comma-separated models under test."
    ),
    judge: str = typer.Option("qwen2.5-coder-0.5b", "--judge", help="The verifying judge model."),
    users: int = typer.Option(30, "--users"),
    max_history: int = typer.Option(100, "--max-history", help="Most recent engagements (0: all)."),
    options: int = typer.Option(50, "--options", help="Options per specificity question."),
    pool_size: int = typer.Option(1000, "--pool-size"),
    taxonomy: bool = typer.Option(True, "--taxonomy/--no-taxonomy"),
    seed: int = typer.Option(0, "--seed"),
    out: str = typer.Option("reports/gist", "--out"),
    as_json: bool = typer.Option(False, "--json", help="Print the scores as JSON."),
) -> None:
    """Extract, verify and score interests (resumable); write report.md + JSON + PNG."""
    from recjudge.evaluators import GistConfig, run_gist

    try:
        cfg = GistConfig(
            models=tuple(m.strip() for m in models.split(",") if m.strip()),
            judge=judge,
            users=users,
            max_history=max_history or None,
            options=options,
            pool_size=pool_size,
            taxonomy=taxonomy,
            seed=seed,
        )
        r = run_gist(cfg, data, out)
    except (UnknownNameError, ValueError, KeyError) as e:
        fail(str(e))
    if as_json:
        emit({m: {k: v for k, v in s.items() if k != "users"} for m, s in r["scores"].items()})
        return
    typer.echo((Path(out) / "report.md").read_text())


@gist_app.command("verify")
def gist_verify(
    data: str = typer.Option(..., "--data", help="The dataset the profiles describe."),
    profiles: str = typer.Option(
        ...,
        "--profiles",
        help="Comma-separated JSONL files, one system each: "
        '{"user_id": ..., "interests": [{"name": ..., "object_ids": [...]}]} per line.',
    ),
    judge: str = typer.Option("qwen2.5-coder-0.5b", "--judge", help="The verifying judge model."),
    oracle: str = typer.Option(
        None, "--oracle", help='JSON {"oracle": {user_id: [category_ids]}} (default: the union).'
    ),
    options: int = typer.Option(50, "--options", help="Options per specificity question."),
    pool_size: int = typer.Option(1000, "--pool-size"),
    taxonomy: bool = typer.Option(True, "--taxonomy/--no-taxonomy"),
    seed: int = typer.Option(0, "--seed"),
    out: str = typer.Option(..., "--out", help="Report folder (records gist score reads)."),
    as_json: bool = typer.Option(False, "--json", help="Print the scores as JSON."),
) -> None:
    """Verify interest profiles from your own system: IG precision/recall/F1 and IS."""
    from recjudge.evaluators import GistConfig, read_oracle, verify_profiles

    try:
        cfg = GistConfig(judge=judge, options=options, pool_size=pool_size, taxonomy=taxonomy,
                         seed=seed)  # fmt: skip
        files = [p.strip() for p in profiles.split(",") if p.strip()]
        r = verify_profiles(cfg, data, files, out, read_oracle(oracle) if oracle else None)
    except (UnknownNameError, ValueError, KeyError, FileNotFoundError) as e:
        fail(str(e).strip("'\""))
    for name, c in r["profiles"].items():
        dropped = {k: v for k, v in c.items() if k in ("unknown_users", "outside_history",
                                                        "merged") and v}  # fmt: skip
        if dropped:
            typer.echo(f"{name}: {dropped} (e.g. {c['examples']})", err=True)
    if as_json:
        emit({m: {k: v for k, v in s.items() if k != "users"} for m, s in r["scores"].items()})
        return
    typer.echo((Path(out) / "report.md").read_text())


@gist_app.command("score")
def gist_score(
    interests: str = typer.Option(
        ...,
        "--interests",
        help="JSONL: user_id, model, interest, category_id, verified, correct, backing.",
    ),
    oracle: str = typer.Option(
        None, "--oracle", help='JSON {"oracle": {user_id: [category_ids]}} (default: the union).'
    ),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Scores from per-interest records alone (no model needed)."""
    from recjudge.evaluators import gist_scores, read_interest_records, read_oracle

    try:
        records = read_interest_records(interests)
        s = gist_scores(records, read_oracle(oracle) if oracle else None)
    except (OSError, ValueError) as e:
        fail(str(e))
    if as_json:
        emit(s)
        return
    for m, v in s.items():
        typer.echo(
            f"{m:<28} IG_P {v['ig_p']:.3f}  IG_R {v['ig_r']:.3f}  IG_F1 {v['ig_f1']:.3f}  "
            f"IS {v['is']:.3f}  interests {v['interests']}"
        )
