"""``recjudge judge``: one Judgment as JSON, or many pairs with a resumable store."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import typer

from recjudge._registry import UnknownNameError
from recjudge._util import json_loads
from recjudge.cli._app import emit, fail, group


def build_judge(*args: Any, **options: Any) -> Any:
    """``reward.build_judge`` with a bad option value as one ValueError line."""
    from pydantic import ValidationError

    from recjudge.reward import build_judge as build

    try:
        return build(*args, **options)
    except ValidationError as e:
        from recjudge.cli._app import option_errors

        raise ValueError(option_errors(e)) from None


judge_app = group("judge", "Judge (user, candidate) pairs; `recjudge judge tune` tunes the "
                  "judge's model on your log.", no_args_is_help=False)  # fmt: skip


@judge_app.callback(invoke_without_command=True)
def judge_cmd(
    ctx: typer.Context,
    data: str = typer.Option("ml-1m", "--data", help="Dataset name or saved folder."),
    user: str = typer.Option(None, "--user", help="User id (single judgment)."),
    candidate: str = typer.Option(
        None,
        "--candidate",
        help="Item id or exact title; id:X or title:X when X could be either.",
    ),
    pairs: str = typer.Option(None, "--pairs", help="JSONL of {user_id, item_id} to score."),
    out: str = typer.Option(None, "--out", help="Results JSONL for --pairs."),
    store: str = typer.Option(None, "--store", help="SQLite store (default: OUT.sqlite)."),
    resume: bool = typer.Option(False, "--resume", help="Skip pairs already in the store."),
    repair: bool = typer.Option(
        False, "--repair", help="With --resume: salvage a damaged store's readable rows first."
    ),
    retry_failed: bool = typer.Option(
        False, "--retry-failed", help="With --resume: judge again the pairs that failed before."
    ),
    model: str = typer.Option(
        "smollm2-135m", "--model", help="The judge LLM: a preset, local folder or HF id."
    ),
    cf: str = typer.Option(None, "--cf", help="A saved CF model folder (sigma source)."),
    mode: str = typer.Option(
        "brief",
        "--mode",
        help="brief, non-adaptive, no-behavior, zero-shot, cf-only, item-item, or a user "
        "simulator: pub, agent4rec, recagent.",
    ),
    beta: float = typer.Option(
        25.0, "--beta", help="Bias strength: delta = beta * (1 + E_n) * sigma on YES."
    ),
    no_evidence: bool = typer.Option(
        False, "--no-evidence", help="Stop at the decision step (reward only)."
    ),
    samples: int = typer.Option(
        0, "--samples", help="Estimate P(YES) from N samples (T 0.7, top-p 0.8)."
    ),
    seed: int = typer.Option(0, "--seed", help="Sampling and CF-training seed."),
    batch_size: int = typer.Option(
        None,
        "--batch-size",
        min=1,
        help="Pairs decoded together (default: all of a user's candidates, up to 64).",
    ),  # fmt: skip
    allow_cf_mismatch: bool = typer.Option(
        False,
        "--allow-cf-mismatch",
        help="Use a CF model trained on other data (unknown items get sigma 0).",
    ),
    max_history: int = typer.Option(
        50, "--max-history", min=1, help="Most recent history items shown in the prompt."
    ),
    backend: str = typer.Option(
        "transformers", "--backend", help="transformers | vllm | openai-compatible."
    ),
    server: str = typer.Option(
        None,
        "--server",
        help="URL of a `recjudge serve` server, e.g. http://127.0.0.1:8000/v1 "
        "(implies --backend openai-compatible; API key from $RECJUDGE_API_KEY).",
    ),
    device: str = typer.Option(
        "auto", "--device", help="In process: auto (CUDA when available), cpu, cuda or cuda:N."
    ),
    ray: str = typer.Option(
        None, "--ray", help="With --pairs: judge on a Ray cluster (auto, local, HOST:PORT)."
    ),
    ray_actors: int = typer.Option(2, "--ray-actors", min=1, help="With --ray: workers."),
    ray_threads: int = typer.Option(
        1, "--ray-threads", min=1, help="With --ray: CPU cores per worker."
    ),
    ray_gpus: float = typer.Option(
        0.0, "--ray-gpus", min=0.0, help="With --ray: GPUs per worker (0: CPU workers)."
    ),
    ray_vllm: str = typer.Option(
        "ray-data-llm",
        "--ray-vllm",
        help="With --ray --backend vllm: ray-data-llm (Ray Data "
        "LLM's vLLM stage) or actors (the whole judge in each worker).",
    ),
) -> None:
    """Judge one (user, candidate) pair, or every pair in --pairs with a progress bar."""
    if ctx.invoked_subcommand is not None:  # `judge tune ...`: the subcommand does the work
        return
    from recjudge.data import load_dataset
    from recjudge.reward import request_for

    if ray is not None and pairs is None:  # before any cluster starts
        fail("--ray judges a --pairs file on a cluster; one --user/--candidate judgment runs in "
             "this process: drop --ray, or give --pairs FILE --out FILE")  # fmt: skip
    try:
        ds = load_dataset(data)
        judge = build_judge(
            model,
            mode,
            cf,
            beta,
            not no_evidence,
            samples,
            seed,
            batch_size,
            backend=backend,
            server=server,
            max_history=max_history,
            dataset=ds,
            device=device,
            ray=_ray_config(ray, ray_actors, ray_threads, ray_gpus, ray_vllm),
        )
        if judge.cf is not None:
            from recjudge.cf_models import check_fits

            check_fits(judge.cf, ds, allow_mismatch=allow_cf_mismatch)
        if pairs is None:
            if user is None or candidate is None:
                fail("give --user and --candidate, or --pairs FILE --out FILE")
            req = request_for(ds, user, _candidate(ds, candidate))
            emit(judge.judge(req).to_dict())
            return
        if out is None:
            fail("--pairs needs --out")
        reqs = _read_pairs(ds, pairs)
        _judge_batch(judge, reqs, out, store, resume, repair, retry_failed)
    except (UnknownNameError, KeyError, ValueError, FileNotFoundError, ConnectionError) as e:
        # DataError, StoreError, CFMismatchError and ServerError are among these.
        fail(str(e).strip("'\""))
    # NonFiniteLogitsError, like every UserFacingError, is printed as one line by cli.main.


def _ray_config(address: str | None, actors: int, threads: int, gpus: float, vllm: str) -> Any:
    if address is None:
        return None
    from pydantic import ValidationError

    from recjudge.reward import RayConfig

    try:
        return RayConfig(address=address, actors=actors, threads=threads, gpus=gpus, vllm=vllm)
    except ValidationError as e:
        err = e.errors()[0]
        flag = "--ray-vllm" if err["loc"] and err["loc"][0] == "vllm" else "--ray"
        fail(f"{flag}: {err['msg']}")


def _read_pairs(ds: Any, pairs: str) -> list[Any]:
    """One request per ``{"user_id", "item_id", ...}`` line (other keys go to ``meta``)."""
    from recjudge.reward import request_for

    reqs = []
    for n, line in enumerate(Path(pairs).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json_loads(line)
            if not isinstance(rec, dict):
                raise ValueError(f"a JSON {type(rec).__name__}, not an object")
            reqs.append(
                request_for(
                    ds,
                    str(rec["user_id"]),
                    str(rec["item_id"]),
                    meta={k: v for k, v in rec.items() if k not in ("user_id", "item_id")},
                )
            )
        except (json.JSONDecodeError, KeyError, ValueError) as e:
            fail(f'{pairs}, line {n}: {e}. Each line must be {{"user_id": ..., "item_id": ...}}')
    return reqs


def _judge_batch(
    judge: Any,
    reqs: list[Any],
    out: str,
    store: str | None,
    resume: bool,
    repair: bool,
    retry_failed: bool,
) -> None:
    """Judge ``reqs`` through the store (resumable), write ``out`` atomically, summarise."""
    from recjudge.reward import ResultsStore

    store_path = Path(store or f"{out}.sqlite")
    if store_path.exists() and not resume:
        fail(f"{store_path} exists; pass --resume to continue it, or remove it")
    if repair and store_path.exists():
        _repair(store_path)
    t0 = time.perf_counter()
    with ResultsStore(store_path) as st:
        results = judge.judge_many(
            reqs, store=st, progress=True, errors="record", retry_failed=retry_failed
        )
    seconds = time.perf_counter() - t0
    tmp = Path(out).with_name(Path(out).name + ".tmp")
    tmp.write_text("".join(json.dumps(r.to_dict(), ensure_ascii=False) + "\n" for r in results))
    tmp.replace(out)
    _summary(results, judge.last_run, seconds, out, store_path)


def _candidate(ds, candidate: str) -> str:
    """The item id ``--candidate`` means: ``id:X`` and ``title:X`` say which; a bare value
    that is one item's id and another item's title is refused, naming both."""
    kind, sep, rest = candidate.partition(":")
    if sep and kind in ("id", "title") and rest:
        if kind == "id":
            if not ds.has_item(rest):
                fail(f"--candidate id:{rest}: dataset {ds.name!r} has no item with id {rest!r}")
            return rest
        same = ds.items.index[ds.items["title"].astype(str) == rest]
        if len(same) != 1:
            fail(f"--candidate title:{rest}: {len(same)} items of dataset {ds.name!r} have "
                 "that exact title; give the item id (id:ID)")  # fmt: skip
        return str(ds.items.iloc[same[0]]["item_id"])
    if ds.has_item(candidate):
        titled = ds.items[ds.items["title"].astype(str) == candidate]["item_id"].astype(str)
        other = [i for i in titled if i != candidate]
        if other:
            own = ds.items.loc[ds.items["item_id"].astype(str) == candidate, "title"].iloc[0]
            fail(
                f"--candidate {candidate!r} is ambiguous in dataset {ds.name!r}: item id "
                f"{candidate!r} ({own!r}) and the title of item {other[0]!r}; pass "
                f"--candidate id:{candidate} or --candidate title:{candidate}"
            )
    return candidate


def _repair(path: Path) -> None:
    """Replace a damaged store by a new one with its readable rows (the old file is kept)."""
    from recjudge.reward import salvage

    fresh = path.with_name(path.name + ".repaired")
    fresh.unlink(missing_ok=True)
    copied, lost = salvage(path, fresh)
    if not fresh.exists():  # nothing readable at all (not a database): start an empty store
        from recjudge.reward import ResultsStore

        ResultsStore(fresh).close()
    broken = path.with_name(path.name + ".broken")
    path.replace(broken)
    for suffix in ("-wal", "-shm"):  # they belong to the old file
        side = Path(f"{path}{suffix}")
        if side.exists():
            side.replace(f"{broken}{suffix}")
    fresh.replace(path)
    typer.echo(f"repaired {path}: {copied} rows kept, {lost} unreadable (old file: {broken})")


def _summary(results, run, seconds: float, out: str, store_path: Path) -> None:
    """One line of counts and throughput; failed pairs (no verdict) with examples on stderr."""
    ok = [r for r in results if r.error is None]
    failed = [r for r in results if r.error is not None]
    yes = sum(r.is_relevant for r in ok)
    rate = f", {run.judged / seconds:.2f} pairs/s" if run and run.judged and seconds > 0 else ""
    # a resumed run: what the interruption left (kept) and what it cost (judged now)
    reused = (f", {run.reused} from the store, {run.judged} judged now"
              if run and run.reused else "")  # fmt: skip
    if run and run.workers:  # --ray: how the work spread over the actors
        reused += (f", on {len(run.workers)} Ray workers ("
                   + ", ".join(str(n) for n in sorted(run.workers.values(), reverse=True))
                   + " pairs)")  # fmt: skip
    if run and run.retried_faults:
        typer.echo(
            f"{run.retried_faults} pairs an earlier run recorded as failed by a fault of the "
            "whole run (model, device, server) were judged again",
            err=True,
        )
    typer.echo(
        f"{len(results)} pairs: {len(ok)} judged ({yes} YES), {len(failed)} failed{reused}"
        f"{rate} -> {out} (store {store_path})"
    )
    if failed:
        for r in failed[:3]:
            typer.echo(f"  user {r.user_id!r}, item {r.candidate_id!r}: {r.error}", err=True)
        typer.echo(
            f"{len(failed)} pairs failed and have no verdict (their lines in {out} carry "
            "'error'); fix the input, then rerun with --resume --retry-failed",
            err=True,
        )


def _tune(job: Any, as_json: bool) -> None:
    from recjudge.cli._jobs import run_job

    run_job("judge-tune", job, as_json)


def _register_tune() -> None:
    """``recjudge judge tune``: the registered job ``judge-tune`` (evaluators' ``JOBS``), its
    options from ``TuneJob`` (torch-free, so ``recjudge judge --help`` stays fast)."""
    from recjudge._tune_config import TuneJob
    from recjudge.cli._options import command_from_config, flag

    summary = (
        "Tune the judge's model on your log (LoRA on the BRIEF prompt and the "
        "evidence-first answer), merged into a folder every backend loads (--model DIR)."
    )
    json_flag = flag("as_json", "--json", "Print the results as JSON.")
    judge_app.command("tune")(command_from_config(TuneJob, _tune, summary, "judge-tune",
                                                  [json_flag]))  # fmt: skip


_register_tune()
