"""Executors of the judge's plan on Ray: Ray actors running recjudge's engine or vLLM, and
vLLM through Ray Data LLM; the worker; the local cluster tests, the bench and the README use.

Above ``reward`` in the layering (``reward`` declares the ``JudgeExecutor`` protocol and
never imports this package): an executor is chosen where a job is built
(``ray_executor``, called by the evaluators' jobs and the command line)."""

from recjudge.distributed._cluster import (
    ADDRESS_WORDS,
    LOOPBACK_ENV,
    LocalCluster,
    RayClusterError,
    RayNotInstalledError,
    connect,
    free_ports,
    is_loopback,
    worker_env_vars,
)
from recjudge.distributed._executor import (
    BLOCK_PAIRS,
    BLOCKS_PER_ACTOR,
    RayConfig,
    RayExecutor,
    WorkerFault,
    block_calls,
    ray_executor,
)
from recjudge.distributed._run import RayRun
from recjudge.distributed._worker import (
    JudgeWorker,
    call_records,
    call_units,
    request_from_record,
    request_record,
)

__all__ = [
    "ADDRESS_WORDS",
    "BLOCK_PAIRS",
    "BLOCKS_PER_ACTOR",
    "LOOPBACK_ENV",
    "JudgeWorker",
    "LocalCluster",
    "RayClusterError",
    "RayConfig",
    "RayExecutor",
    "RayNotInstalledError",
    "RayRun",
    "WorkerFault",
    "block_calls",
    "call_records",
    "call_units",
    "connect",
    "free_ports",
    "is_loopback",
    "ray_executor",
    "request_from_record",
    "request_record",
    "worker_env_vars",
]
