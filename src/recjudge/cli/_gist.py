"""``recjudge gist``: GISTBench interest groundedness and specificity."""

from __future__ import annotations

from pathlib import Path

import typer
from pydantic import ValidationError

from recjudge._registry import UnknownNameError
from recjudge.cli._app import app, emit, fail, option_errors
from recjudge.reporting import interval

gist_app = typer.Typer(
    help="GISTBench: interest extraction, groundedness (IG) and specificity (IS).",
    no_args_is_help=True,
)
app.add_typer(gist_app, name="gist")
TAXONOMY_DEFAULT = "full"
TAXONOMY_HELP = (
    "full (the paper: the judge picks among all 325 categories), shortlist (among 24 "
    "preselected; agreement with full is measured and reported) or off."
)


@gist_app.command("run")
def gist_run(
    data: str = typer.Option("ml-1m", "--data"),
    models: str = typer.Option(
        "smollm2-135m", "--models", help="Comma-separated models under test."
    ),
    judge: str = typer.Option("qwen2.5-coder-0.5b", "--judge", help="The verifying judge model."),
    users: int = typer.Option(30, "--users"),
    max_history: int = typer.Option(
        0, "--max-history", help="Most recent engagements (0, the paper: all, in chunks of 100)."
    ),
    max_interests: int = typer.Option(
        0, "--max-interests", help="Grammar cap on interests per chunk (0, the paper: none)."
    ),
    max_ids: int = typer.Option(0, "--max-ids", help="Grammar cap on ids per interest (0: none)."),
    enforce_citations: bool = typer.Option(
        False, "--enforce-citations", help="Drop citations beyond 2 per object (counted anyway)."
    ),
    options: int = typer.Option(50, "--options", help="Options per specificity question."),
    pool_size: int = typer.Option(1000, "--pool-size"),
    taxonomy: str = typer.Option(TAXONOMY_DEFAULT, "--taxonomy", help=TAXONOMY_HELP),
    example: str = typer.Option(
        "1990s crime thrillers",
        "--example",
        help="The one example interest the extraction prompt gives (write one of your "
        "domain); interests that repeat it are counted in the report.",
    ),
    deterministic: bool = typer.Option(
        False,
        "--deterministic",
        help="Batch-invariant decoding: an answer asked again (a resumed run) repeats "
        "exactly; ~1.6x slower.",
    ),
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
            max_interests=max_interests or None,
            max_ids=max_ids or None,
            enforce_citations=enforce_citations,
            options=options,
            pool_size=pool_size,
            taxonomy=taxonomy,
            interest_example=example,
            deterministic=deterministic,
            seed=seed,
        )
        r = run_gist(cfg, data, out)
    except ValidationError as e:
        fail(option_errors(e))
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
    taxonomy: str = typer.Option(TAXONOMY_DEFAULT, "--taxonomy", help=TAXONOMY_HELP),
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
    except ValidationError as e:
        fail(option_errors(e))
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
    bootstrap: int = typer.Option(
        1000, "--bootstrap", min=0, help="User resamples for the 95 % intervals (0: none)."
    ),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Scores from per-interest records alone (no model needed): medians over users with
    95 % intervals over users (under each model's ``ci``)."""
    from recjudge.evaluators import (
        gist_intervals,
        gist_scores,
        read_interest_records,
        read_oracle,
    )

    try:
        records = read_interest_records(interests)
        s = gist_scores(records, read_oracle(oracle) if oracle else None)
        for m, ci in gist_intervals(s, bootstrap).items():
            s[m]["ci"] = ci
    except (OSError, ValueError) as e:
        fail(str(e))
    if as_json:
        emit(s)
        return
    for m, v in s.items():
        ci = v.get("ci", {}).get("ig_f1")
        band = " " + interval(None, ci["lo"], ci["hi"]) if ci else ""
        typer.echo(
            f"{m:<28} IG_P {v['ig_p']:.3f}  IG_R {v['ig_r']:.3f}  IG_F1 {v['ig_f1']:.3f}{band}  "
            f"IS {v['is']:.3f}  interests {v['interests']}"
        )
