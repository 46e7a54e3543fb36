"""``recjudge gist``: GISTBench interest groundedness and specificity."""

from __future__ import annotations

from pathlib import Path

import typer
from pydantic import ValidationError

from recjudge._util import comma_list
from recjudge.cli._app import app, emit, fail, option_errors
from recjudge.cli._evaluators import evaluator_command
from recjudge.cli._jobs import JOB_ERRORS
from recjudge.cli._options import command_from_config, count_option, flag, text_option
from recjudge.data import load_dataset
from recjudge.evaluators import (
    EVALUATORS,
    EXAMPLE_SYSTEMS,
    GistConfig,
    gist_intervals,
    gist_scores,
    read_interest_records,
    read_oracle,
    verify_profiles,
    write_example_profiles,
)
from recjudge.reporting import interval

gist_app = typer.Typer(
    help="GISTBench: interest extraction, groundedness (IG) and specificity (IS).",
    no_args_is_help=True,
)
app.add_typer(gist_app, name="gist")


gist_app.command("run")(evaluator_command(
    "gist", "Extract, verify and score interests (resumable); write report.md + JSON + PNG."
))  # fmt: skip

#: GistConfig fields that only steer extraction: ``gist verify`` reads the interests instead
EXTRACTION_FIELDS = ("models", "users", "min_history", "max_history", "chunk_size",
                     "max_interests", "max_ids", "extraction_tokens", "words",
                     "interest_example", "max_citations", "enforce_citations")  # fmt: skip


def _verify(cfg: GistConfig, data: str, profiles: str, oracle: str | None, out: str,
            users: int | None, as_json: bool) -> None:  # fmt: skip
    """Verify interest profiles from your own system: IG precision/recall/F1 and IS."""
    try:
        files = list(comma_list(profiles))
        r = verify_profiles(cfg, data, files, out, read_oracle(oracle) if oracle else None,
                            users=users)  # fmt: skip
    except ValidationError as e:
        fail(option_errors(e))
    except JOB_ERRORS as e:
        fail(str(e).strip("'\""))
    for name, c in r["profiles"].items():
        dropped = {k: v for k, v in c.items() if k in ("unknown_users", "outside_history",
                                                        "merged") and v}  # fmt: skip
        if dropped:
            typer.echo(f"{name}: {dropped} (e.g. {c['examples']})", err=True)
    if as_json:
        emit(EVALUATORS.get("gist").view(r))
        return
    typer.echo((Path(out) / "report.md").read_text())


gist_app.command("verify")(command_from_config(
    GistConfig, _verify,
    "Verify interest profiles from your own system: IG precision/recall/F1 and IS. The "
    "options are GISTBench's verification and specificity settings.",
    "gist-verify",
    [
        text_option("data", "--data", "The dataset the profiles describe.", ...),
        text_option("profiles", "--profiles", "Comma-separated JSONL files, one system each: "
                    '{"user_id": ..., "interests": [{"name": ..., "object_ids": [...]}]} per '
                    "line.", ...),
        text_option("oracle", "--oracle", 'JSON {"oracle": {user_id: [category_ids]}} '
                    "(default: the union)."),
        text_option("out", "--out", "Report folder (records gist score reads).", ...),
        count_option("users", "--users", "Score this many users (sha256 order) among those "
                     "with interests in every file: a first answer in minutes; a larger "
                     "number later extends the sample and a rerun into the same --out keeps "
                     "every answer (default: every user of the files)."),
        flag("as_json", "--json", "Print the scores as JSON."),
    ],
    exclude=EXTRACTION_FIELDS,
))  # fmt: skip


@gist_app.command("example-profiles")
def gist_example_profiles(
    data: str = typer.Option("ml-100k", "--data", help="A dataset with item genres."),
    users: int = typer.Option(3, "--users", min=1, help="Users profiled (sha256 order)."),
    out: str = typer.Option(..., "--out", help="Folder for genres.jsonl and popular.jsonl."),
    force: bool = typer.Option(False, "--force", help="Replace files already there."),
) -> None:
    """Write two reference profile systems built from the dataset's genres (each user's
    favourite genres; the catalogue's most frequent ones for everyone), in the format
    `gist verify --profiles` reads: a first run before you have profiles of your own, and
    baselines beside yours."""
    try:
        paths = write_example_profiles(load_dataset(data), out, users=users, force=force)
    except JOB_ERRORS as e:
        fail(str(e).strip("'\""))
    for system, what in EXAMPLE_SYSTEMS.items():
        typer.echo(f"{Path(out) / paths[system].name}: {what}")
    listed = ",".join(str(Path(out) / p.name) for p in paths.values())
    typer.echo(f"next: recjudge gist verify --data {data} --profiles {listed} --out DIR")


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
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON."),
) -> None:
    """Scores from per-interest records alone (no model needed): medians over users with
    95 % intervals over users (under each model's ``ci``)."""
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
