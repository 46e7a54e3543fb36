"""``recjudge judge``: one (user, candidate) pair, or every pair of a JSONL file, as a job.

A registered job like ``impute`` (``JOBS["judge"]``): ``JudgeJob`` holds the judge's
options (``JudgeOptions``, ``--ray`` included) and what to judge; ``run_judge`` reads the
dataset and the pairs, builds the judge (and its executor) once, judges through a resumable
store and writes the results; ``judge_text`` is what the console shows. Bad input raises
``ValueError`` naming the file, line or option and the fix, printed as one line.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from recjudge._judge_options import JudgeJob, JudgeOptions, Warn
from recjudge._util import json_loads
from recjudge.cf_models import check_fits
from recjudge.data import load_dataset
from recjudge.distributed import ray_executor
from recjudge.reward import ResultsStore, build_judge, repair_store, request_for


def run_judge(job: JudgeJob, progress: bool = True, warn: Warn | None = None) -> dict[str, Any]:
    """Run ``recjudge judge``: the one judgment (``{"judgment": ...}``), or the file's pairs
    judged through the store and written to ``out`` (counts, throughput, paths, failures).

    Raises:
        ValueError: bad input (named with its fix), a store that exists without
            ``resume``, a mode that needs ``--cf`` without it.
    """
    warn = warn or (lambda m: None)
    if job.pairs is None and (job.user is None or job.candidate is None):
        raise ValueError("give --user and --candidate, or --pairs FILE --out FILE")
    if job.pairs is not None and job.out is None:
        raise ValueError("--pairs needs --out")
    # checked against the backend and the cluster before any data or model is loaded
    executor = ray_executor(job.ray_config(), job.model, job.backend, job.server, job.device)
    ds = load_dataset(job.data)
    judge = judge_of(job, ds, executor, job.backend, job.server, job.samples, job.seed)
    if job.pairs is None:
        req = request_for(ds, job.user, candidate_id(ds, job.candidate))  # type: ignore[arg-type]
        return {"judgment": judge.judge(req).to_dict()}
    return _judge_file(job, judge, read_pairs(ds, job.pairs), progress, warn)


def judge_of(
    opts: JudgeOptions,
    data: Any,
    executor: Any = None,
    backend: str = "transformers",
    server: str | None = None,
    samples: int = 0,
    seed: int = 0,
) -> Any:
    """The judge a job's ``JudgeOptions`` describe (``reward.build_judge``), on ``executor``
    (``distributed.ray_executor``, built by the caller before it loads anything), its CF
    model checked against ``data`` (``allow_cf_mismatch``). The one place the options
    become a judge, for ``judge``, ``impute`` and ``augment``."""
    judge = build_judge(
        opts.model, opts.mode, opts.cf, opts.beta, not opts.no_evidence, samples, seed,
        opts.batch_size, backend=backend, server=server, max_history=opts.max_history,
        dataset=data, device=opts.device, executor=executor, layout=opts.layout,
        marking=opts.marking,
    )  # fmt: skip
    if judge.cf is not None:
        check_fits(judge.cf, data, allow_mismatch=opts.allow_cf_mismatch)
    return judge


def read_pairs(ds: Any, pairs: str) -> list[Any]:
    """One request per ``{"user_id", "item_id", ...}`` line (other keys go to ``meta``)."""
    reqs = []
    for n, line in enumerate(Path(pairs).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json_loads(line)
            if not isinstance(rec, dict):
                raise ValueError(f"a JSON {type(rec).__name__}, not an object")
            meta = {k: v for k, v in rec.items() if k not in ("user_id", "item_id")}
            reqs.append(request_for(ds, str(rec["user_id"]), str(rec["item_id"]), meta=meta))
        except (json.JSONDecodeError, KeyError, ValueError) as e:
            raise ValueError(
                f'{pairs}, line {n}: {e}. Each line must be {{"user_id": ..., "item_id": ...}}'
            ) from None
    return reqs


def _judge_file(
    job: JudgeJob, judge: Any, reqs: list[Any], progress: bool, warn: Warn
) -> dict[str, Any]:
    """Judge ``reqs`` through the store (resumable), write ``out`` atomically, count."""
    out = str(job.out)
    store_path = Path(job.store or f"{out}.sqlite")
    if store_path.exists() and not job.resume:
        raise ValueError(f"{store_path} exists; pass --resume to continue it, or remove it")
    if job.repair and store_path.exists():
        warn(repair_store(store_path))
    t0 = time.perf_counter()
    with ResultsStore(store_path) as st:
        results = judge.judge_many(reqs, store=st, progress=progress, errors="record",
                                   retry_failed=job.retry_failed)  # fmt: skip
    seconds = time.perf_counter() - t0
    tmp = Path(out).with_name(Path(out).name + ".tmp")
    tmp.write_text("".join(json.dumps(r.to_dict(), ensure_ascii=False) + "\n" for r in results))
    tmp.replace(out)
    run = judge.last_run
    failed = [r for r in results if r.error is not None]
    if run is not None and run.retried_faults:
        warn(f"{run.retried_faults} pairs an earlier run recorded as failed by a fault of the "
             "whole run (model, device, server) were judged again")  # fmt: skip
    for r in failed[:3]:
        warn(f"  user {r.user_id!r}, item {r.candidate_id!r}: {r.error}")
    if failed:
        warn(f"{len(failed)} pairs failed and have no verdict (their lines in {out} carry "
             "'error'); fix the input, then rerun with --resume --retry-failed")  # fmt: skip
    return {
        "pairs": len(results), "judged": len(results) - len(failed),
        "yes": sum(r.is_relevant for r in results if r.error is None), "failed": len(failed),
        "reused": run.reused if run else 0, "judged_now": run.judged if run else 0,
        "workers": dict(run.workers) if run else {}, "seconds": round(seconds, 3),
        "out": out, "store": str(store_path),
    }  # fmt: skip


def judge_text(job: JudgeJob, res: dict[str, Any]) -> str:
    """The console's view: the judgment as JSON, or one line of counts and throughput."""
    if "judgment" in res:
        return json.dumps(res["judgment"], indent=2, ensure_ascii=False, default=str)
    now, s = res["judged_now"], res["seconds"]
    rate = f", {now / s:.2f} pairs/s" if now and s > 0 else ""
    # a resumed run: what the interruption left (kept) and what it cost (judged now)
    reused = f", {res['reused']} from the store, {now} judged now" if res["reused"] else ""
    if res["workers"]:  # --ray: how the work spread over the actors
        counts = ", ".join(str(n) for n in sorted(res["workers"].values(), reverse=True))
        reused += f", on {len(res['workers'])} Ray workers ({counts} pairs)"
    return (f"{res['pairs']} pairs: {res['judged']} judged ({res['yes']} YES), {res['failed']} "
            f"failed{reused}{rate} -> {res['out']} (store {res['store']})")  # fmt: skip


def candidate_id(ds: Any, candidate: str) -> str:
    """The item id ``--candidate`` means: ``id:X`` and ``title:X`` say which; a bare value
    that is one item's id and another item's title is refused, naming both."""
    kind, sep, rest = candidate.partition(":")
    if sep and kind in ("id", "title") and rest:
        if kind == "id":
            if not ds.has_item(rest):
                raise ValueError(
                    f"--candidate id:{rest}: dataset {ds.name!r} has no item with id {rest!r}; "
                    "give one of its item ids, or title:TITLE"
                )
            return rest
        same = ds.items.index[ds.items["title"].astype(str) == rest]
        if len(same) != 1:
            raise ValueError(
                f"--candidate title:{rest}: {len(same)} items of dataset {ds.name!r} have "
                "that exact title; give the item id (id:ID)"
            )
        return str(ds.items.iloc[same[0]]["item_id"])
    if ds.has_item(candidate):
        titled = ds.items[ds.items["title"].astype(str) == candidate]["item_id"].astype(str)
        other = [i for i in titled if i != candidate]
        if other:
            own = ds.items.loc[ds.items["item_id"].astype(str) == candidate, "title"].iloc[0]
            raise ValueError(
                f"--candidate {candidate!r} is ambiguous in dataset {ds.name!r}: item id "
                f"{candidate!r} ({own!r}) and the title of item {other[0]!r}; pass "
                f"--candidate id:{candidate} or --candidate title:{candidate}"
            )
    return candidate
