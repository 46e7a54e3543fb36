"""Judging on a Ray cluster: ``Judge.judge_many`` with a ``RayExecutor``.

What runs where:

- **the driver** (the process that runs ``impute``, ``judge --pairs`` or ``augment``): it
  reads the files, builds the requests, computes every key and reuses what the store
  holds, computes sigma with the CF model (loaded once, here; never shipped to workers),
  plans the engine calls (``Judge.plan``: one user's candidates together, so a history is
  encoded once), and writes each finished call to the run's one results store in one
  transaction as it arrives;
- **the workers**: a pool of Ray actors (``ActorPoolStrategy``), each holding one backend
  (recjudge's engine on ``threads`` CPU cores or one GPU; or, with ``backend="vllm"`` and
  ``RayConfig.vllm="actors"``, vLLM in the actor with recjudge's bias processor, grammar and
  decision log-probabilities, as ``--backend vllm`` in one process), render and tokenise the
  prompts (so titles are escaped by the same code as in one process) and decode them
  (``Judge.judge_prepared``).

With ``backend="vllm"`` and ``RayConfig.vllm="ray-data-llm"`` (the default) vLLM runs in Ray
Data LLM's stage (``ray.data.llm``) instead: the driver also builds every engine request and
replays every decision record, and the workers only run vLLM (``reward._ray_data_llm``).

The requests travel as a Ray Dataset of engine calls, one block each, as JSON strings (Ray
turns nested lists into numpy arrays; a string arrives as it left). Ray Data restarts an
actor that dies and runs its block again; the driver keeps the first answer per request,
so the store holds each pair once, and a rerun (``--resume``) skips every pair a finished
block wrote. A fault of the whole run on a worker (the model is not installed on that
node, NaN weights) comes back as data and ends the run with its line.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from recjudge._util import RunFault, first_line

if TYPE_CHECKING:
    from recjudge.llm import LLMConfig
    from recjudge.reward._judge import Judge
    from recjudge.reward._judgment import JudgeRequest, Judgment

log = logging.getLogger(__name__)

#: ``--ray`` values besides a cluster address
ADDRESS_WORDS = ("auto", "local")
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


class RayClusterError(RunFault, ConnectionError):
    """The Ray cluster cannot be reached or used (a fault of the whole run)."""


class RayNotInstalledError(RunFault, RuntimeError):
    """``ray[data]`` is not installed in this environment."""


class WorkerFault(RunFault, RuntimeError):
    """A fault of the whole run raised on a Ray worker (its text names the original)."""


class RayConfig(BaseModel):
    """Where and how wide a distributed judgment runs. Not part of any result key: the
    workers compute what one process computes (same dtype and device, resolved once on the
    driver), and a pair's key names the device when it is a GPU.

    Attributes:
        address: ``auto`` (the cluster this machine belongs to: ``$RAY_ADDRESS`` or the one
            ``ray start`` started here), ``local`` (start a Ray instance in this process,
            bound to 127.0.0.1, for one machine), or a head's ``HOST:PORT`` / ``ray://``
            address.
        actors: how many workers judge at once (each holds one copy of the model).
        threads: CPU cores per worker (its torch threads).
        gpus: GPUs per worker (0: CPU workers; 1: one GPU each, the model on ``cuda``).
        vllm: how ``backend="vllm"`` runs on the workers: ``ray-data-llm`` (Ray Data LLM's
            vLLM stage, ``ray.data.llm``; the driver builds every request and replays every
            decision record, the workers only run vLLM) or ``actors`` (recjudge's whole
            judge in each Ray Data actor, vLLM inside it). The same answers either way.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    address: str = "auto"
    actors: int = Field(2, ge=1, le=4096)
    threads: int = Field(1, ge=1, le=512)
    gpus: float = Field(0.0, ge=0.0, le=64.0)
    vllm: Literal["ray-data-llm", "actors"] = "ray-data-llm"

    @field_validator("address")
    @classmethod
    def _address(cls, v: str) -> str:
        v = v.strip()
        if not v or any(c.isspace() for c in v) or len(v) > 512:
            raise ValueError(
                "a Ray address is auto, local, HOST:PORT or ray://HOST:PORT (no spaces)"
            )
        return v


#: Ray's one switch that keeps a node on the loopback address (read when ``ray`` is imported)
LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def is_loopback(address: str) -> bool:
    """Whether a ``HOST:PORT`` names this machine's loopback interface."""
    host = address.rpartition(":")[0].strip("[]")
    return host in ("localhost", "::1") or host.startswith("127.")


def loopback_only() -> None:
    """Keep this process's Ray on 127.0.0.1, so a one-machine cluster is not open to the
    network.

    Ray turns a loopback ``--node-ip-address`` or cluster address into the machine's outward
    address (``services.resolve_ip_for_localhost``) and then listens on every interface with
    no authentication: anyone who reaches the machine can run code in it. Its only switch
    back to 127.0.0.1 is ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` (as on macOS), read into
    ``ray_constants.ENABLE_RAY_CLUSTER`` at import; where ``ray`` is imported already that
    constant is set too. It also makes a driver reach a loopback head by 127.0.0.1 (without
    it the driver dials the outward address, which a sandboxed network may not route back).
    A head that does listen outward is still reached (Ray falls back to its one node).
    """
    os.environ[LOOPBACK_ENV] = "0"
    consts = sys.modules.get("ray._private.ray_constants")
    if consts is not None:
        consts.ENABLE_RAY_CLUSTER = False


def _ray() -> Any:
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError:
        raise RayNotInstalledError(
            "--ray needs Ray Data: pip install 'recjudge[ray]' (or make setup, which installs "
            "the lock's ray)"
        ) from None
    return ray


#: recjudge settings a worker must share with its driver; secrets stay on the driver (a
#: worker needs neither the server key nor the checkpoint key)
_SECRET_ENV = frozenset({"RECJUDGE_API_KEY", "RECJUDGE_CHECKPOINT_KEY"})


def worker_env_vars() -> dict[str, str]:
    """What every worker of this driver's job gets in its environment: the driver's model
    cache (``RECJUDGE_CACHE``, resolved: a worker that used its own ``~/.cache`` converted the
    model again, silently, and the second waited on the build lock) and every other
    ``RECJUDGE_*`` setting (the forced dtype, ...), secrets left out; and the driver's
    niceness (``RAY_worker_niceness``)."""
    from recjudge._util import cache_dir

    env = {k: v for k, v in os.environ.items()
           if k.startswith("RECJUDGE_") and k not in _SECRET_ENV}  # fmt: skip
    env["RECJUDGE_CACHE"] = str(cache_dir())
    # Ray starts workers at nice 15 (they lost the CPU to anything else running): at the
    # driver's own niceness instead, as Ray's job supervisor does for its drivers
    env["RAY_worker_niceness"] = str(os.nice(0))
    return env


def connect(address: str) -> Any:
    """Join (or for ``local`` start) the Ray cluster at ``address``; returns the ``ray``
    module. Quiet: Ray Data's progress lines are replaced by the judge's own bar."""
    ray = _ray()
    if not ray.is_initialized():
        kwargs: dict[str, Any] = {"logging_level": logging.WARNING, "log_to_driver": True}
        if address == "local":
            kwargs.update(include_dashboard=False, _node_ip_address="127.0.0.1")
        else:
            kwargs["address"] = address
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        _probe(address)
        target = _auto_address(ray) if address == "auto" else address
        if address == "local" or is_loopback(target):
            loopback_only()
        # this process's Ray core logs only what stops it (it warns on every run that an
        # actor's constructor arguments live in the object store, which is how Ray Data
        # starts any actor pool)
        os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "fatal")
        kwargs["runtime_env"] = {"env_vars": worker_env_vars()}
        try:
            ray.init(**kwargs)
        except (ConnectionError, RuntimeError, ValueError, TimeoutError) as e:
            first = first_line(e)
            raise RayClusterError(
                f"Ray cluster {address!r} cannot be reached ({first}); start one with "
                f"`{LOOPBACK_ENV}=0 ray start --head --node-ip-address 127.0.0.1` (then --ray "
                "auto), give its HOST:PORT, or use --ray local on one machine; a head with "
                f"token authentication also needs {AUTH_MODE_ENV}=token here (and "
                f"{AUTH_TOKEN_PATH_ENV} where its token is not in ~/.ray/auth_token)"
            ) from None
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    for name in ("ray.data", "ray.data._internal"):
        logging.getLogger(name).setLevel(logging.ERROR)
    return ray


def _auto_address(ray: Any) -> str:
    """The head ``--ray auto`` joins, as Ray finds it: ``RAY_ADDRESS``, else the head this
    machine started last (Ray records it under /tmp/ray), else a running one; "" for none."""
    try:
        found = ray._private.services.get_ray_address_from_environment("auto", None)
    except Exception:  # none running: ray.init says so in its own words below
        return ""
    return str(found or "")


def _probe(address: str) -> None:
    """Fail in seconds where nothing listens at a ``HOST:PORT`` (``ray.init`` retries for
    minutes)."""
    if address in ADDRESS_WORDS or "://" in address:
        return
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise RayClusterError(
            f"--ray {address!r}: a cluster address is HOST:PORT (the head's `ray start "
            "--head --port`), auto or local"
        )
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=5):
            pass
    except OSError as e:
        raise RayClusterError(
            f"--ray {address}: nothing answers there ({e.strerror or e}); start the head with "
            f"`ray start --head --port {port}` or check the address"
        ) from None


def request_record(req: JudgeRequest, history_of: int | None = None) -> dict[str, Any]:
    """What a worker needs of a request to render and decode it (its sigma travels beside
    it; ``meta`` stays on the driver). ``history_of``: the position, in the same call, of a
    request with this very history, sent in its place (one user's candidates share one
    history: sent once per call, not once per pair)."""
    return {
        "user_id": req.user_id,
        **({"history_of": history_of} if history_of is not None else
           {"history": [[h.item_id, h.title, h.text, h.rating] for h in req.history]}),
        "candidate_id": req.candidate_id,
        "candidate_text": req.candidate_text,
        "candidate_title": req.candidate_title,
        "domain": req.domain,
    }  # fmt: skip


def call_records(reqs: Sequence[JudgeRequest]) -> list[dict[str, Any]]:
    """``request_record`` of one call's requests, each history sent once."""
    out: list[dict[str, Any]] = []
    holders: dict[tuple[str, ...], int] = {}
    for n, req in enumerate(reqs):
        ids = tuple(h.item_id for h in req.history)
        j = holders.setdefault(ids, n)
        # same ids, same texts and ratings (a shared list compares by identity, at once)
        same = j if j != n and reqs[j].history == req.history else None
        out.append(request_record(req, same))
    return out


def request_from_record(d: dict[str, Any], earlier: Sequence[JudgeRequest] = ()) -> JudgeRequest:
    """The request of ``request_record``'s ``d``; ``earlier``: the call's requests before it
    (where a ``history_of`` points)."""
    from recjudge.reward._judgment import JudgeRequest
    from recjudge.reward._prompt import HistoryItem

    if "history_of" in d:
        history = earlier[int(d["history_of"])].history
    else:
        history = [HistoryItem(str(a), str(b), str(c), r) for a, b, c, r in d["history"]]
    return JudgeRequest(
        user_id=d["user_id"],
        history=history,
        candidate_id=d["candidate_id"],
        candidate_text=d["candidate_text"],
        candidate_title=d["candidate_title"],
        domain=d["domain"],
    )


def worker_name() -> str:
    """This process as the driver names a worker: ``host:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"


class JudgeWorker:
    """A Ray Data actor holding one judge (one backend); each row is one engine call.

    The model loads on the first call, not in ``__init__``: a load that fails (not
    installed on this node) then comes back as a fault row the driver ends the run with,
    instead of an actor Ray Data would restart forever.
    """

    def __init__(self, config: str, llm_config: str, record: bool) -> None:
        self._config, self._llm_config, self._record = config, llm_config, record
        self._judge: Any = None

    def _load(self) -> Any:
        if self._judge is None:
            from recjudge.llm import LLMConfig
            from recjudge.reward._judge import Judge
            from recjudge.reward._judge_config import JudgeConfig

            llm_config = LLMConfig.model_validate_json(self._llm_config)
            judge = Judge(JudgeConfig.model_validate_json(self._config), llm_config=llm_config)
            judge.warm_up()
            self._judge = judge
        return self._judge

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        import numpy as np

        out = [self.unit(str(text)) for text in batch["unit"]]
        return {"result": np.array(out, dtype=object)}

    def unit(self, text: str) -> str:
        """One block's engine calls (JSON) -> their results (JSON)."""
        from recjudge.reward._judgment import Judgment, error_text

        results: list[dict[str, Any]] = []
        try:
            judge = self._load()
            for call in json.loads(text):
                reqs: list[Any] = []
                for x in call:
                    reqs.append(request_from_record(x["req"], reqs))
                got = judge.judge_prepared(
                    reqs, [x["key"] for x in call], [x["sigma"] for x in call], self._record
                )
                for x, j in zip(call, got, strict=True):
                    if isinstance(j, Judgment):
                        results.append({"i": x["i"], "judgment": j.to_dict()})
                    else:
                        results.append({"i": x["i"], "error": error_text(j)})
        except RunFault as e:
            return json.dumps({"fault": error_text(e)})
        except Exception as e:  # noqa: BLE001 - raise mode: the driver raises it
            return json.dumps({"fault": error_text(e), "run_fault": False})
        return json.dumps({"results": results, "worker": worker_name()})


@dataclass(frozen=True)
class RayRun:
    """One Ray run's planned work, what both of its paths (our engine on Ray actors, vLLM
    through Ray Data LLM) are given: the judge and its requests, their keys, the engine calls
    planned from them (each request with its index, key and sigma), the LLM config the
    workers load, and whether a request's error is recorded rather than raised."""

    judge: Judge
    reqs: Sequence[JudgeRequest]
    keys: Sequence[str]
    calls: list[list[dict[str, Any]]]
    llm_config: LLMConfig
    record: bool

    def failure(self, i: int, error: str) -> Judgment:
        """Request ``i``'s recorded failure, under its key."""
        return self.judge.failure(self.reqs[i], error, self.keys[i])


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

    def run(
        self,
        judge: Judge,
        reqs: Sequence[JudgeRequest],
        keys: Sequence[str],
        todo: list[int],
        record: bool,
    ) -> Iterator[tuple[list[int], list[Judgment]]]:
        from recjudge.llm import resolve_llm_config
        from recjudge.reward._judgment import error_text

        if judge.llm_loaded_here():
            raise ValueError(
                "--ray loads the model on the workers; a backend loaded here cannot be shipped "
                "there (give the judge an llm_config, e.g. LLMConfig(backend='vllm'), not a "
                "loaded llm; or run without --ray)"
            )
        self._workers.clear()
        calls: list[list[dict[str, Any]]] = []
        failed_at: list[int] = []
        failed: list[Judgment] = []
        # sigma once per user and history, not per pair (the driver's second cost)
        sigmas = dict(zip(todo, judge.sigmas_for([reqs[i] for i in todo]), strict=True))
        # at least BLOCKS_PER_ACTOR calls per actor where the users allow: a small run (the
        # README's 10 users, one call of 30 pairs) otherwise leaves all but one actor idle
        for unit in judge.plan(reqs, todo, spread=BLOCKS_PER_ACTOR * self.config.actors):
            ok = []
            for i in unit:
                sigma = sigmas[i]
                if isinstance(sigma, Exception):
                    if not record:
                        raise sigma
                    failed_at.append(i)
                    failed.append(judge.failure(reqs[i], error_text(sigma), keys[i]))
                    continue
                ok.append(i)
            if ok:
                records = call_records([reqs[i] for i in ok])
                calls.append([{"i": i, "key": keys[i], "sigma": sigmas[i], "req": rec}
                              for i, rec in zip(ok, records, strict=True)])  # fmt: skip
        if failed:  # sigma failed for these: nothing to decode
            yield failed_at, failed
        if not calls:
            return
        llm_config = self.placed(resolve_llm_config(judge.llm_config_or_model()))
        run = RayRun(judge, reqs, keys, calls, llm_config, record)
        if llm_config.backend == "vllm" and self.config.vllm == "ray-data-llm":
            from recjudge.reward._ray_data_llm import stream_on_ray_data_llm

            yield from stream_on_ray_data_llm(self, run)
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
    from recjudge.reward._judgment import Judgment

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


# -- a local cluster (tests, the bench, the README's one-machine example) -----------------


#: Ray's token authentication: its mode, and where the token is (a file, or the token itself,
#: which wins over the file)
AUTH_MODE_ENV, AUTH_TOKEN_PATH_ENV, AUTH_TOKEN_ENV = (
    "RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_TOKEN")  # fmt: skip


def _reload_ray_auth() -> None:
    """Have this process's Ray read the authentication variables again (it caches them at
    first use; the same two calls as Ray's ``reset_auth_token_state``)."""
    if "ray._raylet" not in sys.modules:
        return  # read when Ray first needs them
    from ray._raylet import AuthenticationTokenLoader, Config

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


#: what ``ray start --block`` prints once its head's processes are up
_STARTED = "Ray runtime started"


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return True
    except OSError:
        return False


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports free on 127.0.0.1 now: every socket stays bound until all are
    chosen, so the kernel cannot hand out one port twice (one at a time it may, and Ray
    refuses two components on one port)."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(n):
            s = stack.enter_context(socket.socket())
            s.bind(("127.0.0.1", 0))
            ports.append(int(s.getsockname()[1]))
        return ports


@dataclass
class LocalCluster:
    """A single-node Ray cluster on 127.0.0.1 started with ``ray start --head --block`` and
    stopped by its process: ``with LocalCluster(cpus=2) as c: ... c.address``.

    Its ports are chosen free and bound to 127.0.0.1 only (``loopback_only``); its files go
    under ``temp_dir`` (a short path: Ray's socket names must fit 107 bytes).

    It runs with Ray's token authentication and a token of its own (a 0600 file in a private
    folder, removed by ``stop``), so another user of the machine cannot run code in it and
    what earlier Ray runs left in ``~/.ray/auth_token`` does not change how it starts (Ray
    2.60 turns authentication on for a head wherever that file exists, and off for a driver
    given an explicit address). ``env`` holds what a driver needs (``RAY_ADDRESS`` and the
    authentication variables); the process that starts the cluster is set up as its driver
    (its environment is restored by ``stop``), another process is given ``env``.
    """

    cpus: int = 2
    temp_dir: str | None = None
    timeout_s: float = 120.0
    address: str = ""
    process: subprocess.Popen | None = None
    env: dict[str, str] = field(default_factory=dict)
    _saved_env: dict[str, str | None] = field(default_factory=dict, repr=False)
    _auth_dir: str | None = field(default=None, repr=False)

    def _make_token(self) -> dict[str, str]:
        self._auth_dir = tempfile.mkdtemp(prefix="rj-ray-auth-")
        path = Path(self._auth_dir) / "auth_token"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
        return {AUTH_MODE_ENV: "token", AUTH_TOKEN_PATH_ENV: str(path)}

    def _drive_here(self) -> None:
        """Make this process a driver of the cluster (``stop`` undoes it)."""
        self._saved_env = {k: os.environ.get(k) for k in (*self.env, AUTH_TOKEN_ENV)}
        os.environ.pop(AUTH_TOKEN_ENV, None)  # would win over the token file
        os.environ.update(self.env)
        loopback_only()  # also where this process imported ray already (start did)
        _reload_ray_auth()

    def _restore_env(self) -> None:
        for k, v in self._saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if self._saved_env:
            _reload_ray_auth()
        self._saved_env = {}

    def start(self) -> LocalCluster:
        _ray()  # installed, or one line saying how
        bin_dir = Path(sys.executable).parent
        exe = bin_dir / "ray"
        names = (
            "node-manager-port",
            "object-manager-port",
            "dashboard-agent-grpc-port",
            "dashboard-agent-listen-port",
            "metrics-export-port",
            "runtime-env-agent-port",
        )
        port, *others = free_ports(1 + len(names))
        cmd = [str(exe) if exe.exists() else "ray", "start", "--head", "--block",
               f"--port={port}", "--node-ip-address=127.0.0.1", f"--num-cpus={self.cpus}",
               "--num-gpus=0", "--include-dashboard=false", "--disable-usage-stats",
               # every fixed default port chosen free, so two clusters (two test
               # processes) on one machine do not collide
               *(f"--{name}={p}" for name, p in zip(names, others, strict=True))]  # fmt: skip
        if self.temp_dir:
            cmd.append(f"--temp-dir={self.temp_dir}")
        # no dashboard, so no metrics agent: do not have every process retry reaching it;
        # every process of the cluster on 127.0.0.1 only (loopback_only says why)
        cluster = {LOOPBACK_ENV: "0", **self._make_token()}
        env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_enable_metrics_collection="0",
                   **cluster)  # fmt: skip
        env.pop(AUTH_TOKEN_ENV, None)
        logs = Path(self.temp_dir or "/tmp")
        logs.mkdir(parents=True, exist_ok=True)
        self.log_path = logs / f"recjudge-ray-{port}.log"
        self.process = subprocess.Popen(
            cmd, stdout=open(self.log_path, "w"), stderr=subprocess.STDOUT,  # noqa: SIM115
            start_new_session=True, env=env,
        )  # fmt: skip
        self.address = f"127.0.0.1:{port}"
        deadline = time.monotonic() + self.timeout_s
        # Ready when `ray start` says its processes are up and the GCS port answers. Not
        # `ray status`: that also waits for the autoscaler's monitor, which a driver does not
        # need, and starts a Python process a second on the cores the head is starting on.
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                code, tail = self.process.returncode, self._log_tail()
                self.stop()
                raise RayClusterError(f"ray start exited ({code}): {tail}")
            if _STARTED in self.log_path.read_text(errors="replace") and _answers(port):
                self.env = {"RAY_ADDRESS": self.address, **cluster}
                self._drive_here()
                return self
            time.sleep(0.5)
        self.stop()
        raise RayClusterError(
            f"the Ray head did not start in {self.timeout_s:.0f} s: {self._log_tail()}"
        )

    def _log_tail(self, lines: int = 6) -> str:
        """The last lines ``ray start`` printed, and where the rest is."""
        try:
            text = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            text = []
        return " | ".join(text[-lines:] + [f"full log: {self.log_path}"])

    def pids(self) -> list[int]:
        """The head's process and every process it started (workers included)."""
        import psutil

        if self.process is None:
            return []
        try:
            root = psutil.Process(self.process.pid)
            return [root.pid] + [p.pid for p in root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def stop(self) -> None:
        """Disconnect this process's driver from the cluster, SIGTERM the head's process
        group, then SIGKILL whatever of it is left; remove its token."""
        import psutil

        if self.process is None:
            self._forget_token()
            return
        ray = sys.modules.get("ray")
        if ray is not None and ray.is_initialized():
            with contextlib.suppress(Exception):  # a driver of another cluster stays
                if ray.get_runtime_context().gcs_address == self.address:
                    ray.shutdown()
        tree = self.pids()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(10)
        for pid in tree:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)
        psutil.wait_procs([p for p in map(_proc, tree) if p is not None], timeout=10)
        self.process = None
        self._forget_token()

    def _forget_token(self) -> None:
        # the environment first: a draining Ray thread in token mode whose file is gone
        # aborts the process (Ray's reset_auth_token_state does it in this order too)
        self._restore_env()
        if self._auth_dir:
            shutil.rmtree(self._auth_dir, ignore_errors=True)
            self._auth_dir = None

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _proc(pid: int) -> Any:
    import psutil

    try:
        return psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None
