"""One-shot latency: a cold CLI judgment, its parts, and warm judgments in one process."""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from recjudge.reporting import write_report


def _wall(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
    return dt


def _cold(model: str, user: str, candidate: str, repeats: int) -> dict[str, float]:
    """Wall seconds of fresh processes: the whole CLI judgment, and import + data alone."""
    cli = str(Path(sys.executable).with_name("recjudge"))
    judge = [cli, "judge", "--data", "ml-1m", "--user", user, "--candidate", candidate]
    judge += ["--model", model, "--mode", "no-behavior"]
    data = [
        sys.executable,
        "-c",
        "import time; t = time.perf_counter(); import recjudge.cli; "
        "from recjudge.data import load_dataset; t1 = time.perf_counter(); "
        "load_dataset('ml-1m'); print(t1 - t, time.perf_counter() - t1)",
    ]
    walls = [_wall(judge) for _ in range(repeats)]
    parts = []
    for _ in range(repeats):
        out = subprocess.run(data, capture_output=True, text=True, check=True).stdout.split()
        parts.append((float(out[0]), float(out[1])))
    return {
        "cli_judgment_s": statistics.median(walls),
        "cli_judgment_runs_s": walls,
        "import_s": statistics.median(p[0] for p in parts),
        "data_load_s": statistics.median(p[1] for p in parts),
    }


def _warm(model: str, users: list[str], history: int, seed: int) -> dict[str, Any]:
    """In one process with the model loaded: a new user's first judgment (its history
    prefix encoded) and a second candidate of the same user (prefix reused), with
    evidence, BRIEF with ALS sigma."""
    from recjudge.cf_models import cached_cf
    from recjudge.data import load_dataset
    from recjudge.llm import LLMConfig, load_llm
    from recjudge.reward import Judge, JudgeConfig, request_for

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
    from recjudge.data import load_dataset, sample_users

    ds = load_dataset("ml-1m")
    chosen = [u for u in sample_users(ds.user_ids(), 200, seed) if len(ds.history(u)) >= history]
    chosen = chosen[: users + 1]
    results: dict[str, Any] = {"model": model, "history": history, "seed": seed}
    results["cold"] = _cold(model, "1", "Toy Story (1995)", repeats)
    results["warm"] = _warm(model, chosen, history, seed)
    c, w = results["cold"], results["warm"]
    lines = [
        f"# One-shot latency ({model})",
        "",
        "| what | seconds |",
        "|---|---|",
        f"| cold CLI judgment (`recjudge judge --user 1 --candidate 'Toy Story (1995)' "
        f"--mode no-behavior`, wall, median of {repeats}) | {c['cli_judgment_s']:.2f} |",
        f"| of which: import recjudge.cli | {c['import_s']:.2f} |",
        f"| of which: load ML-1M (parsed cache) | {c['data_load_s']:.2f} |",
        f"| model load in process | {w['model_load_s']:.2f} |",
        f"| warm judgment with evidence, new user ({history}-item history, BRIEF, ALS sigma, "
        f"median of {len(w['new_user_runs_s'])}) | {w['new_user_judgment_s']:.2f} |",
        f"| warm judgment with evidence, same user (prefix reused) | "
        f"{w['same_user_judgment_s']:.2f} |",
        "",
        f"Warm verdicts: {w['yes']} YES of {w['judgments']}.",
    ]
    write_report(out, results, lines)
    return results
