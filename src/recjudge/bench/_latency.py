"""One-shot latency: a cold CLI judgment, its parts, and warm judgments in one process."""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from recjudge._util import json_loads
from recjudge.cf_models import cached_cf
from recjudge.data import load_dataset, sample_users
from recjudge.llm import PRESETS, LLMConfig, load_llm, resolve_model_path
from recjudge.reporting import write_report
from recjudge.reward import Judge, JudgeConfig, request_for


def _wall(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
    return dt


#: a fresh process that times, in the order a CLI judgment meets them, the parts of its start
#: (the judgment's own compute is what is left of its wall time), then the CLI's judgment in
#: that process twice: first (kernels, the grammar compiler and the tokenizer's first uses
#: inside) and again with the prefix cache emptied (the prefill and the answer alone: the
#: compute floor). Its imports run with the cyclic collector paused, and what they built is
#: frozen, as the command line does (``_util.imports_paused``): the floor's parts are timed
#: the way the CLI meets them
_PARTS = """
import gc, json, sys, time
t = time.perf_counter()
parts = {}
def lap(name):
    global t
    now = time.perf_counter()
    parts[name] = now - t
    t = now
model, impl, user, candidate = sys.argv[1:5]
import recjudge.cli
lap("import_s")
gc.disable()  # the start's imports with the collector paused, as the CLI's (after its own)
import torch
lap("torch_import_s")
from recjudge.data import load_dataset
gc.freeze()
gc.enable()
ds = load_dataset("ml-1m")
lap("data_load_s")
gc.disable()
from recjudge.llm import LLMConfig, load_llm, resolve_model_path
from recjudge.llm._native import native_support
native = impl != "transformers" and native_support(resolve_model_path(model)) is None
import xgrammar  # the grammar engine; it imports transformers' package (not its models)
if not native:  # transformers' tokenizer, config and modelling modules
    from transformers.models.auto.tokenization_auto import tokenizer_class_from_name
    from transformers import MODEL_FOR_CAUSAL_LM_MAPPING, AutoConfig
    config = AutoConfig.from_pretrained(resolve_model_path(model))
    MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]  # imports the model's modelling code
gc.enable()
lap("transformers_import_s")
llm = load_llm(LLMConfig(model=model, backend="transformers", implementation=impl))
lap("model_load_s")
gc.disable()
from recjudge.reward import Judge, JudgeConfig, clear_prefix_cache, request_for
gc.enable()
judge = Judge(JudgeConfig(model=model, mode="no-behavior"), llm=llm)
req = request_for(ds, user, candidate)
lap("judge_built_s")
judge.judge(req)
lap("first_judgment_s")
clear_prefix_cache(llm)
judge.judge(req)
lap("warm_judgment_s")
parts["native"] = native
print(json.dumps(parts))
"""

#: the parts of a cold CLI judgment's start (``_PARTS``), before the judgment itself
START_PARTS = ("import_s", "torch_import_s", "data_load_s", "transformers_import_s",
               "model_load_s")  # fmt: skip


def _cold(model: str, user: str, candidate: str, repeats: int, impl: str) -> dict[str, Any]:
    """Wall seconds of fresh processes: the whole CLI judgment, and the parts of its start
    (``_PARTS``), each the median of ``repeats`` processes, with the model on
    ``impl`` (``LLMConfig.implementation``)."""
    cli = str(Path(sys.executable).with_name("recjudge"))
    judge = [cli, "--implementation", impl, "judge", "--data", "ml-1m", "--user", user]
    judge += ["--candidate", candidate, "--model", model, "--mode", "no-behavior"]
    _wall(judge)  # untimed: fills what a machine keeps (tokenizer, token table, CF model)
    walls = [_wall(judge) for _ in range(repeats)]
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", _PARTS, model, impl, user, candidate],
                              capture_output=True, text=True, check=True)  # fmt: skip
        wall = time.perf_counter() - t0
        run = json_loads(proc.stdout.splitlines()[-1])
        # the interpreter's start and its exit (modules torn down, torch's and xgrammar's
        # threads joined): the process's wall time that none of its laps holds
        run["start_exit_s"] = max(wall - sum(v for k, v in run.items() if k != "native"), 0.0)
        runs.append(run)
    return cold_summary(walls, runs)


def cold_summary(walls: list[float], runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The cold CLI judgment's wall (median of ``walls``), each part (median over the
    ``_PARTS`` processes ``runs``), the judgment's share (the wall less the start's parts and
    the interpreter's start and exit), the floor (those parts, start and exit, and the
    judgment's compute alone: ``warm_judgment_s``) and the wall over the floor."""
    native = runs[0]["native"]  # the same checkpoint and setting in every run
    parts = {k: statistics.median(r[k] for r in runs) for k in runs[0] if k != "native"}
    wall = statistics.median(walls)
    start = sum(parts[k] for k in START_PARTS)
    # the floor: what any cold judgment must do (start and end a Python process, import
    # its libraries, read the data and the weights) and the judgment's compute alone
    # (prefill and answer, warm)
    floor = start + parts["start_exit_s"] + parts["warm_judgment_s"]
    # The rest: options, the prompt, the grammar, the prefill and the answer's tokens.
    return {"cli_judgment_s": wall, "cli_judgment_runs_s": walls, **parts, "native": native,
            "judgment_s": max(wall - start - parts["start_exit_s"], 0.0), "floor_s": floor,
            "over_floor": wall / floor if floor > 0 else None}  # fmt: skip


def _warm(model: str, users: list[str], history: int, seed: int) -> dict[str, Any]:
    """In one process with the model loaded: a new user's first judgment (its history
    prefix encoded) and a second candidate of the same user (prefix reused), with
    evidence, BRIEF with ALS sigma."""
    ds = load_dataset("ml-1m")
    cf, _, _ = cached_cf("als", ds, {"factors": 64, "iterations": 15}, seed=seed)
    t0 = time.perf_counter()
    llm = load_llm(LLMConfig(model=model, backend="transformers"))  # measures in process
    load_s = time.perf_counter() - t0
    judge = Judge(JudgeConfig(model=model, max_history=history), llm=llm, cf=cf)
    items = ds.items["item_id"].astype(str).tolist()
    first, second, yes = [], [], 0
    judge.judge(request_for(ds, users[0], items[0]))  # warm-up: kernels, grammar compiler
    for k, u in enumerate(users[1:]):
        for times, item in ((first, items[1 + 2 * k]), (second, items[2 + 2 * k])):
            t0 = time.perf_counter()
            j = judge.judge(request_for(ds, u, item))
            times.append(time.perf_counter() - t0)
            yes += j.is_relevant
    return {
        "model_load_s": load_s,
        "new_user_judgment_s": statistics.median(first),
        "same_user_judgment_s": statistics.median(second),
        "new_user_runs_s": first,
        "same_user_runs_s": second,
        "yes": yes,
        "judgments": len(first) + len(second),
    }


def bench_latency(
    model: str = "smollm2-135m",
    users: int = 6,
    history: int = 50,
    repeats: int = 3,
    seed: int = 0,
    out: str | Path = "reports/latency",
) -> dict[str, Any]:
    """Cold CLI judgment (wall, fresh process) and warm in-process judgments with evidence."""
    if model not in PRESETS and not Path(model).expanduser().exists():
        resolve_model_path(model)  # a mistyped name: "did you mean", before any process starts
    ds = load_dataset("ml-1m")
    chosen = [u for u in sample_users(ds.user_ids(), 200, seed) if len(ds.history(u)) >= history]
    chosen = chosen[: users + 1]
    results: dict[str, Any] = {"model": model, "history": history, "seed": seed}
    # the default (auto: the native forward where the checkpoint fits) and transformers'
    # model, in the same run (after one another; each a median of `repeats` processes)
    results["cold"] = _cold(model, "1", "Toy Story (1995)", repeats, "auto")
    results["cold_transformers"] = _cold(model, "1", "Toy Story (1995)", repeats, "transformers")
    results["warm"] = _warm(model, chosen, history, seed)
    write_report(out, results, _lines(results, model, repeats, history))
    return results


def _lines(results: dict[str, Any], model: str, repeats: int, history: int) -> list[str]:
    """The report: the cold judgment's parts and floor per implementation, then warm."""
    c, t, w = results["cold"], results["cold_transformers"], results["warm"]

    def row(label: str, key: str) -> str:
        return f"| {label} | {c[key]:.2f} | {t[key]:.2f} |"

    auto = "native forward" if c["native"] else "transformers (checkpoint not native)"
    lines = [
        f"# One-shot latency ({model})",
        "",
        f"| what (seconds) | default: {auto} | `--implementation transformers` |",
        "|---|---|---|",
        row(
            f"cold CLI judgment (`recjudge judge --user 1 --candidate 'Toy Story (1995)' "
            f"--mode no-behavior`, wall, median of {repeats})",
            "cli_judgment_s",
        ),
        row("of which: import recjudge.cli", "import_s"),
        row("of which: import torch", "torch_import_s"),
        row("of which: load ML-1M (parsed cache)", "data_load_s"),
        row(
            "of which: import xgrammar (and with it transformers' package; transformers: "
            "also its tokenizer, config and modelling modules)",
            "transformers_import_s",
        ),
        row("of which: tokenizer and weights", "model_load_s"),
        row(
            "of which: the interpreter's start and exit (torn-down modules, joined threads)",
            "start_exit_s",
        ),
        row("of which: the judgment (prompt, grammar, prefill, answer; the rest)", "judgment_s"),
        row(
            "the same judgment in a fresh process after the start above: first", "first_judgment_s"
        ),
        row("the same judgment again, prefix cache emptied (its compute alone)", "warm_judgment_s"),
        row(
            "**floor**: the start's parts, start and exit, the judgment's compute alone", "floor_s"
        ),
        f"| **cold CLI judgment / floor** | **{c['over_floor']:.2f}x** | "
        f"**{t['over_floor']:.2f}x** |",
        "",
        "The floor is what any cold judgment must do: start and end a Python process, import "
        "the libraries, read the data and the weights, and compute the prompt's prefill and "
        "the answer (timed warm, so first-use costs are not in it). Above it: the CLI's own "
        "work (options, the request, the store check), and the first judgment's first uses "
        "(kernel set-up, the grammar compiler, the tokenizer's first calls): the first "
        "in-process judgment minus the warm one. The start's imports run with Python's "
        "cyclic collector paused, in the CLI and in the floor's timing alike "
        "(`imports_paused`). Wall seconds, medians of the runs.",
        "",
        f"Cold CLI judgment, default / transformers: "
        f"**{c['cli_judgment_s'] / t['cli_judgment_s']:.2f}x** the time.",
        "",
        "| warm, in one process (default implementation) | seconds |",
        "|---|---|",
        f"| model load | {w['model_load_s']:.2f} |",
        f"| warm judgment with evidence, new user ({history}-item history, BRIEF, ALS sigma, "
        f"median of {len(w['new_user_runs_s'])}) | {w['new_user_judgment_s']:.2f} |",
        f"| warm judgment with evidence, same user (prefix reused) | "
        f"{w['same_user_judgment_s']:.2f} |",
        "",
        f"Warm verdicts: {w['yes']} YES of {w['judgments']}.",
    ]
    return lines
