"""``recjudge judge``: one Judgment as JSON, or many pairs with a resumable store."""

from __future__ import annotations

import inspect
from typing import Any

import typer

from recjudge._judge_options import JUDGE_SUMMARY, JudgeJob
from recjudge._tune_config import TuneJob
from recjudge.cli._app import group
from recjudge.cli._options import command_from_config, flag

judge_app = group("judge", "Judge (user, candidate) pairs; `recjudge judge tune` tunes the "
                  "judge's model on your log.", no_args_is_help=False)  # fmt: skip


def _judge(job: Any, as_json: bool, ctx: typer.Context) -> None:
    if ctx.invoked_subcommand is not None:  # `judge tune ...`: the subcommand does the work
        return
    from recjudge.cli._jobs import run_job

    run_job("judge", job, as_json)


def _register_judge() -> None:
    """``recjudge judge``: the registered job ``judge`` (evaluators' ``JOBS``), its options
    from ``JudgeJob`` (torch-free, so ``recjudge judge --help`` stays fast), as the callback
    of the ``judge`` group (so ``judge tune`` is its subcommand)."""
    ctx = inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)
    json_flag = flag("as_json", "--json", "Print the results as JSON.")
    command = command_from_config(JudgeJob, _judge, JUDGE_SUMMARY, "judge", [json_flag, ctx])
    judge_app.callback(invoke_without_command=True)(command)


_register_judge()


def _tune(job: Any, as_json: bool) -> None:
    from recjudge.cli._jobs import run_job

    run_job("judge-tune", job, as_json)


def _register_tune() -> None:
    """``recjudge judge tune``: the registered job ``judge-tune`` (evaluators' ``JOBS``), its
    options from ``TuneJob`` (torch-free, so ``recjudge judge --help`` stays fast)."""
    summary = (
        "Tune the judge's model on your log (LoRA on the BRIEF prompt and the "
        "evidence-first answer), merged into a folder every backend loads (--model DIR)."
    )
    json_flag = flag("as_json", "--json", "Print the results as JSON.")
    judge_app.command("tune")(command_from_config(TuneJob, _tune, summary, "judge-tune",
                                                  [json_flag]))  # fmt: skip


_register_tune()
