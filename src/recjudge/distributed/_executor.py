"""Judging on a Ray cluster: ``Judge.judge_many`` with a ``RayExecutor`` (an executor of the
judge's plan, ``reward.JudgeExecutor``).

What runs where:

- **the driver** (the process that runs ``impute``, ``judge --pairs`` or ``augment``): it
  reads the files, builds the requests, computes every key and reuses what the store
  holds, computes sigma with the CF model (loaded once, here; never shipped to workers),
  plans the engine calls (``JudgePlan``, the plan one process runs: one user's candidates
  together, so a history is encoded once), and writes each finished call to the run's one
  results store in one transaction as it arrives;
- **the workers**: a pool of Ray actors (``ActorPoolStrategy``), each holding one backend
  (recjudge's engine on ``threads`` CPU cores or one GPU; or, with ``backend="vllm"`` and
  ``RayConfig.vllm="actors"``, vLLM in the actor with recjudge's bias processor, grammar and
  decision log-probabilities, as ``--backend vllm`` in one process), render and tokenise the
  prompts (so titles are escaped by the same code as in one process) and decode them
  (``Judge.judge_prepared``).

With ``backend="vllm"`` and ``RayConfig.vllm="ray-data-llm"`` (the default) vLLM runs in Ray
Data LLM's stage (``ray.data.llm``) instead: the driver also builds every engine request and
replays every decision record, and the workers only run vLLM (``distributed._ray_data_llm``).

The requests travel as a Ray Dataset of engine calls, one block each, as JSON strings (Ray
turns nested lists into numpy arrays; a string arrives as it left). Ray Data restarts an
actor that dies and runs its block again; the driver keeps the first answer per request,
so the store holds each pair once, and a rerun (``--resume``) skips every pair a finished
block wrote. A fault of the whole run on a worker (the model is not installed on that
node, NaN weights) comes back as data and ends the run with its line.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from recjudge._ray_config import RayConfig
from recjudge._util import RunFault, first_line, gc_paused
from recjudge.distributed._cluster import RayClusterError, connect
from recjudge.distributed._ray_data_llm import stream_on_ray_data_llm
from recjudge.distributed._run import RayRun
from recjudge.distributed._worker import JudgeWorker, call_units
from recjudge.llm import LLMConfig, resolve_llm_config
from recjudge.reward import Judgment, history_sent

if TYPE_CHECKING:
    from recjudge.llm import LLMConfig
    from recjudge.reward import Judge, JudgePlan, Judgment

log = logging.getLogger(__name__)


#: most Ray Data blocks one run makes (a worker lost mid-block redoes that block's calls)
MAX_BLOCKS = 10_000
#: pairs a Ray Data block aims at: Ray Data costs the driver ~4-5 ms of CPU per block (bench
#: ray-scaling), so a block of one 8-pair call cost ~500 us per judgment, more than all of the
#: driver's own work; 128 pairs bring it to ~35 us, ~0.4 s of one GPU worker's time to redo
BLOCK_PAIRS = 128
#: blocks per actor at least, when there are calls enough: every actor busy to the end
BLOCKS_PER_ACTOR = 4
#: how long a run waits for its whole actor pool to load the model before it hands out work
ACTORS_START_S = 1800


def block_calls(calls: Sequence[Sequence[Any]], actors: int) -> list[list[Any]]:
    """The engine calls grouped into Ray Data blocks, in order: about ``BLOCK_PAIRS`` pairs a
    block, but at least ``BLOCKS_PER_ACTOR`` blocks per actor (and at most one block per
    call, at most ``MAX_BLOCKS``)."""
    if not calls:
        return []
    pairs = sum(len(c) for c in calls)
    want = max(-(-pairs // BLOCK_PAIRS), BLOCKS_PER_ACTOR * max(actors, 1))
    n = max(1, min(len(calls), want, MAX_BLOCKS))
    cut = [b * len(calls) // n for b in range(n + 1)]  # n blocks, sizes within one call
    return [list(calls[cut[b] : cut[b + 1]]) for b in range(n)]


class WorkerFault(RunFault, RuntimeError):
    """A fault of the whole run raised on a Ray worker (its text names the original)."""


@dataclass(frozen=True)
class RayExecutor:
    """``Judge(executor=RayExecutor(RayConfig(...)))``: ``judge_many`` decodes on a Ray
    cluster's actors (see the module's docstring for what runs where)."""

    config: RayConfig = RayConfig()
    #: pairs judged per worker in the last run (filled as blocks come back)
    _workers: dict[str, int] = field(default_factory=dict, compare=False, repr=False)

    def workers(self) -> dict[str, int]:
        """Pairs each actor (``host:pid``) judged in the last run; empty through Ray Data
        LLM (its vLLM stage does not say)."""
        return dict(self._workers)

    def placed(self, llm_config: LLMConfig) -> LLMConfig:
        """The ``LLMConfig`` every worker loads: dtype and device resolved here, once, so a
        worker on another CPU computes (and keys) what the driver says."""
        self.check_backend(llm_config.backend)
        device = "cuda" if self.config.gpus > 0 else "cpu"
        placed = llm_config.model_copy(update={"device": device})
        return placed.model_copy(
            update={"dtype": placed.resolved_dtype(), "num_threads": self.config.threads}
        )

    @staticmethod
    def check_backend(backend: str) -> None:
        """Refuse a backend the workers cannot hold: a server spreads its own work."""
        if backend not in ("transformers", "vllm"):
            raise ValueError(
                f"--ray: backend {backend!r} is a server, which spreads its own work; drop "
                "--ray (or --server), or run recjudge's engine or vLLM on the workers"
            )

    def ready(self, vllm_stage: bool = False) -> Any:
        """Join the cluster and check it can place the workers (``ray`` module); a job calls
        this before it writes anything, so a cluster fault leaves no output behind.
        ``vllm_stage``: the workers are Ray Data LLM's vLLM engines (``_check_fits``)."""
        ray = connect(self.config.address)
        self._check_fits(ray.cluster_resources(), vllm_stage)
        return ray

    def _check_fits(self, resources: dict[str, float], vllm_stage: bool = False) -> None:
        """Refuse workers the cluster cannot place (Ray would wait for them forever): one
        worker's threads or GPUs beyond the cluster's; with ``vllm_stage``, engines that
        would hold every CPU, since Ray Data's own tasks (reading the rows in) need one
        beside them and wait forever without (seen on a 2-CPU head, --ray-threads 2)."""
        cpus, gpus = resources.get("CPU", 0.0), resources.get("GPU", 0.0)
        if vllm_stage and self.config.threads * self.config.actors >= cpus:
            raise RayClusterError(
                f"--ray-actors {self.config.actors} x --ray-threads {self.config.threads}: Ray "
                f"Data LLM's vLLM workers would hold all {cpus:g} CPUs of the cluster, and Ray "
                "Data needs one beside them; use fewer --ray-threads or --ray-actors, or add a "
                "node"
            )
        if self.config.threads > cpus:
            raise RayClusterError(
                f"--ray-threads {self.config.threads}: the cluster has {cpus:g} CPUs in all; "
                f"use --ray-threads {max(int(cpus), 1)} or fewer, or add nodes"
            )
        if self.config.gpus > gpus:
            raise RayClusterError(
                f"--ray-gpus {self.config.gpus:g}: the cluster has {gpus:g} GPUs; use "
                "--ray-gpus 0 (CPU workers) or start GPU nodes (`ray start --address HEAD`)"
            )

    def calls_wanted(self) -> int:
        """At least ``BLOCKS_PER_ACTOR`` calls per actor where the users allow: a small run
        (the README's 10 users, one call of 30 pairs) otherwise leaves all but one actor
        idle."""
        return BLOCKS_PER_ACTOR * self.config.actors

    def run(
        self, judge: Judge, plan: JudgePlan, record: bool
    ) -> Iterator[tuple[list[int], list[Judgment]]]:
        if judge.llm_loaded_here():
            raise ValueError(
                "--ray loads the model on the workers; a backend loaded here cannot be shipped "
                "there (give the judge an llm_config, e.g. LLMConfig(backend='vllm'), not a "
                "loaded llm; or run without --ray)"
            )
        self._workers.clear()
        reqs, keys = plan.reqs, plan.keys
        shown = history_sent(judge.config, judge.role)
        with gc_paused():  # a burst of records (see gc_paused)
            calls = call_units(reqs, plan.calls, keys, plan.sigmas, shown)
        llm_config = self.placed(resolve_llm_config(judge.llm_config_or_model()))
        run = RayRun(judge, reqs, keys, calls, llm_config, record)
        if llm_config.backend == "vllm" and self.config.vllm == "ray-data-llm":
            ray = self.ready(vllm_stage=True)
            yield from stream_on_ray_data_llm(ray, self.config, run)
            return
        yield from self._stream(run)

    def _stream(self, run: RayRun) -> Iterator[tuple[list[int], list[Judgment]]]:
        ray = self.ready()
        calls = run.calls
        blocks = [json.dumps(b) for b in block_calls(calls, self.config.actors)]
        expected = {x["i"] for call in calls for x in call}
        ds = ray.data.from_items([{"unit": b} for b in blocks], override_num_blocks=len(blocks))
        remote: dict[str, Any] = {"num_cpus": self.config.threads}
        if self.config.gpus > 0:
            remote["num_gpus"] = self.config.gpus
        ds = ds.map_batches(
            JudgeWorker,
            batch_size=1,
            compute=ray.data.ActorPoolStrategy(size=min(self.config.actors, len(blocks))),
            fn_constructor_kwargs={
                "config": run.judge.config.model_dump_json(),
                "llm_config": run.llm_config.model_dump_json(),
                "record": run.record,
            },
            batch_format="numpy",
            **remote,
        )
        seen: set[int] = set()
        # Ray Data hands blocks to the first actor that is up (up to 4 in flight each) while
        # the others still load the model, so a small run could be judged by one actor while
        # --ray-actors asked for more: the pool starts whole before any block is handed out.
        context = ray.data.DataContext.get_current()
        waited, context.wait_for_min_actors_s = context.wait_for_min_actors_s, ACTORS_START_S
        try:
            for batch in ds.iter_batches(batch_size=None, batch_format="numpy"):
                for text in batch["result"]:
                    got = json.loads(str(text))
                    idx, out = _merge_block(got, run, seen, expected)
                    if idx and "worker" in got:
                        name = str(got["worker"])
                        self._workers[name] = self._workers.get(name, 0) + len(idx)
                    if idx:
                        yield idx, out
        except ray.exceptions.RayError as e:
            first = first_line(e)
            raise RayClusterError(
                f"the Ray run failed ({type(e).__name__}: {first}); finished pairs are in the "
                "store: run again with --resume to judge the rest"
            ) from None
        finally:
            context.wait_for_min_actors_s = waited
        missing = expected - seen
        if missing:
            raise RayClusterError(
                f"the Ray run ended with {len(missing)} pairs not returned; finished pairs are "
                "in the store: run again with --resume"
            )


def _merge_block(
    got: dict[str, Any], run: RayRun, seen: set[int], expected: set[int]
) -> tuple[list, list]:
    """One worker block's answers as (indices, judgments), each request kept once (a
    retried block's second answer is dropped); a fault there ends the run."""
    if "fault" in got:
        if got.get("run_fault", True):
            raise WorkerFault(f"on a Ray worker: {got['fault']}")
        raise ValueError(f"on a Ray worker: {got['fault']}")
    idx, out = [], []
    for r in got["results"]:
        i = int(r["i"])
        if i in seen or i not in expected:
            continue
        seen.add(i)
        idx.append(i)
        if "error" in r:
            out.append(run.failure(i, r["error"]))
        else:
            out.append(Judgment.from_dict(r["judgment"]))
    return idx, out


def ray_executor(
    ray: RayConfig | None, model: str, backend: str, server: str | None, device: str
) -> RayExecutor | None:
    """The Ray executor of ``--ray`` (None without it), checked against the backend the
    model would run on (these options, else the command line's root ``--backend/--server``)
    and the cluster, before anything is written or started."""
    if ray is None:
        return None

    given = {"backend": backend} if backend != "transformers" else {}
    if server:
        given = {"backend": "openai-compatible", "base_url": server}
    RayExecutor.check_backend(resolve_llm_config(LLMConfig(model=model, **given)).backend)
    if device not in ("auto", "cpu", "cuda"):
        raise ValueError("with --ray, --ray-gpus places the model (leave --device unset)")
    executor = RayExecutor(ray)
    executor.ready()  # a cluster fault ends the job before it writes anything
    return executor
