"""``recjudge usersum``: UserSumBench summary quality by future-activity prediction."""

from __future__ import annotations

import typer

from recjudge.cli._app import app
from recjudge.cli._evaluators import evaluator_command

usersum_app = typer.Typer(
    help="UserSumBench: summarisers judged by how well their summaries predict the future.",
    no_args_is_help=True,
)
app.add_typer(usersum_app, name="usersum")


usersum_app.command("run")(evaluator_command(
    "usersum", "Summarise, predict, score (resumable); write report.md + JSON + PNG."
))  # fmt: skip
