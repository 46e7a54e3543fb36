"""``recjudge usersum``: UserSumBench summary quality by future-activity prediction."""

from __future__ import annotations

from pathlib import Path

import typer
from pydantic import ValidationError

from recjudge._registry import UnknownNameError
from recjudge.cli._app import app, emit, fail, option_errors

usersum_app = typer.Typer(
    help="UserSumBench: summarisers judged by how well their summaries predict the future.",
    no_args_is_help=True,
)
app.add_typer(usersum_app, name="usersum")


@usersum_app.command("run")
def usersum_run(
    data: str = typer.Option("ml-1m", "--data"),
    summarizer: str = typer.Option("single,hierarchy", "--summarizer", help="single, hierarchy."),
    model: str = typer.Option("qwen2.5-coder-0.5b", "--model", help="The summariser LLM."),
    predictor: str = typer.Option("qwen2.5-coder-0.5b", "--predictor"),
    users: int = typer.Option(30, "--users"),
    runs: int = typer.Option(3, "--runs", help="Prediction runs for mean +- sd."),
    word_limit: int = typer.Option(150, "--word-limit"),
    critique_rounds: int = typer.Option(2, "--critique-rounds"),
    segmentation: str = typer.Option(
        "time",
        "--segmentation",
        help="time (the paper: windows of equal duration with >= --min-segment activities) "
        "or count.",
    ),
    min_segment: int = typer.Option(40, "--min-segment", help="Fewest activities per segment."),
    seed: int = typer.Option(0, "--seed"),
    out: str = typer.Option("reports/usersum", "--out"),
    as_json: bool = typer.Option(False, "--json", help="Print the table as JSON."),
) -> None:
    """Summarise, predict, score (resumable); write report.md + JSON + PNG."""
    from recjudge.evaluators import UserSumConfig, run_usersum

    try:
        cfg = UserSumConfig(
            summarizers=tuple(s.strip() for s in summarizer.split(",") if s.strip()),
            model=model,
            predictor=predictor,
            users=users,
            runs=runs,
            word_limit=word_limit,
            critique_rounds=critique_rounds,
            segmentation=segmentation,
            min_segment=min_segment,
            seed=seed,
        )
        r = run_usersum(cfg, data, out)
    except ValidationError as e:
        fail(option_errors(e))
    except (UnknownNameError, ValueError, KeyError) as e:
        fail(str(e))
    if as_json:
        emit(r["table"])
        return
    typer.echo((Path(out) / "report.md").read_text())
