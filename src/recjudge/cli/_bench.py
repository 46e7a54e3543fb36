"""``recjudge bench``: benchmarks that write reports/<name>/ (report.md + results.json)."""

from __future__ import annotations

from typing import Any

import typer

from recjudge._registry import UnknownNameError
from recjudge.cli._app import app, emit, fail

bench_app = typer.Typer(help="Benchmarks and experiments that write reports.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")


@bench_app.command("throughput")
def bench_throughput_cmd(
    model: str = typer.Option("qwen2.5-coder-0.5b", "--model"),
    users: int = typer.Option(3, "--users"),
    candidates: int = typer.Option(20, "--candidates"),
    threads: int = typer.Option(2, "--threads"),
    seed: int = typer.Option(0, "--seed"),
    beta: float = typer.Option(25.0, "--beta", help="BRIEF beta of the workload."),
    dtype: str = typer.Option(
        "auto", "--dtype", help="auto | bfloat16 | float32 (every method alike)."
    ),
    methods: str = typer.Option(
        None, "--methods", help="Comma-separated subset (the naive references always run)."
    ),
    out: str = typer.Option(None, "--out", help="Default: reports/throughput/<model>[-fp32]."),
    vllm_python: str = typer.Option(
        ".venv-vllm/bin/python",
        "--vllm-python",
        help="The vLLM environment's interpreter (make setup-vllm); vLLM rows are skipped "
        "when it does not exist.",
    ),
) -> None:
    """Naive generate(), the recjudge engines, one-pass sweeps, llama.cpp and vLLM, like for
    like."""
    from recjudge.bench import bench_throughput
    from recjudge.llm import LLMConfig

    resolved = LLMConfig(model=model, dtype=dtype).resolved_dtype()
    suffix = "" if resolved == "bfloat16" else "-fp32" if resolved == "float32" else f"-{resolved}"
    r = bench_throughput(
        model,
        users,
        candidates,
        threads=threads,
        seed=seed,
        beta=beta,
        out=out or f"reports/throughput/{model}{suffix}",
        dtype=dtype,
        methods=tuple(m.strip() for m in methods.split(",")) if methods else None,
        vllm_python=vllm_python,
    )
    for name, m in r["methods"].items():
        typer.echo(
            f"{name:<22} {m['kind']:<8} {m['pairs_per_s']:.3f} pairs/s  agreement "
            f"{100 * m['agreement_with_naive']:.1f} %  YES {100 * m['yes_rate']:.0f} %  "
            f"peak {m['peak_rss_mb']:.0f} MB"
        )
    for k, v in r["ratios"].items():
        typer.echo(f"{k}: {v:.2f}x")


@bench_app.command("latency")
def bench_latency_cmd(
    model: str = typer.Option("smollm2-135m", "--model"),
    users: int = typer.Option(6, "--users"),
    repeats: int = typer.Option(3, "--repeats"),
    seed: int = typer.Option(0, "--seed"),
    out: str = typer.Option(None, "--out", help="Default: reports/latency/<model>."),
) -> None:
    """Cold CLI judgment (fresh process) and warm judgments with evidence."""
    from recjudge.bench import bench_latency

    r = bench_latency(
        model, users, repeats=repeats, seed=seed, out=out or f"reports/latency/{model}"
    )
    c, w = r["cold"], r["warm"]
    typer.echo(
        f"cold CLI judgment {c['cli_judgment_s']:.2f} s (import {c['import_s']:.2f} s, data "
        f"{c['data_load_s']:.2f} s); warm new user {w['new_user_judgment_s']:.2f} s, same "
        f"user {w['same_user_judgment_s']:.2f} s"
    )


@bench_app.command("estimator-speed")
def bench_estimator_speed_cmd(
    users: int = typer.Option(6040, "--users", min=1),
    runs: int = typer.Option(5, "--runs", min=1),
    k: int = typer.Option(20, "--k", min=1),
    repeats: int = typer.Option(3, "--repeats", min=1),
    out: str = typer.Option("reports/estimator-speed", "--out"),
) -> None:
    """Wall time of `evaluate` with and without every estimator at ML-1M's size."""
    from recjudge.bench._estimator_speed import bench_estimator_speed

    r = bench_estimator_speed(users, runs, k, repeats, out)
    emit(r["median_seconds"])


@bench_app.command("gpu-check")
def bench_gpu_check_cmd(
    tokenizer: str = typer.Option(
        None, "--tokenizer", help="Qwen2.5 tokenizer folder (default: the preset's cache)."
    ),
    device: str = typer.Option("auto", "--device", help="auto | cpu | cuda | cuda:N"),
    dtype: str = typer.Option("auto", "--dtype", help="auto (bf16 on a GPU) | bfloat16 | float32"),
    users: int = typer.Option(10, "--users", min=1),
    candidates: int = typer.Option(20, "--candidates", min=1),
    layers: int = typer.Option(None, "--layers", min=1, help="Fewer layers: a quick look."),
    out: str = typer.Option("reports/gpu-check", "--out"),
) -> None:
    """Engine vs generate() on Qwen2.5-1.5B's architecture with random weights: parity and
    judgments/s (no weights or network needed; see scripts/pack_gpu_check.sh)."""
    from recjudge.bench._gpu_check import gpu_check, qwen_tokenizer
    from recjudge.llm import DeviceError

    try:
        r = gpu_check(tokenizer or qwen_tokenizer(), device, dtype, users, candidates,
                      layers=layers, out=out)  # fmt: skip
    except DeviceError as e:
        fail(str(e))
    emit(r)


@bench_app.command("decoding")
def bench_decoding_cmd(
    model: str = typer.Option("qwen2.5-coder-0.5b", "--model"),
    titles: int = typer.Option(200, "--titles"),
    out: str = typer.Option("reports/decoding", "--out"),
) -> None:
    """Grammar compile time and per-token mask + bias overhead vs a decode step."""
    from recjudge.bench import bench_decoding

    r = bench_decoding(model, n_titles=titles, out=out)
    typer.echo(
        f"compile {r['compile_ms']['median']:.1f} ms; overhead "
        f"{100 * r['overhead_fraction']:.2f} % of a decode step"
    )


@bench_app.command("cf")
def bench_cf_cmd(
    sasrec: str = typer.Option(..., "--sasrec", help="A SASRec folder from `cf train`."),
    saved: str = typer.Option(
        "", "--saved", help="More saved models as NAME=DIR,... (e.g. fm=runs/fm,nrms=runs/nrms)."
    ),
    train: str = typer.Option(
        "als,bpr,itemknn,pop", "--train", help="Models trained here with default configs."
    ),
    data: str = typer.Option("ml-1m", "--data"),
    out: str = typer.Option("reports/cf", "--out"),
) -> None:
    """SASRec vs the paper, with the other models on the same protocols."""
    from recjudge.bench import bench_cf

    pairs = [p.partition("=") for p in saved.split(",") if p.strip()]
    bad = [n for n, eq, d in pairs if not (eq and n.strip() and d.strip())]
    if bad:
        fail(f"--saved: {bad[0]!r} is not NAME=DIR; write e.g. --saved fm=runs/fm")
    dirs = {n.strip(): d.strip() for n, _, d in pairs}
    names = [n.strip() for n in train.split(",") if n.strip()]
    try:
        r = bench_cf(sasrec, data, out=out, saved=dirs, train=names)
    except (UnknownNameError, ValueError, FileNotFoundError) as e:
        fail(str(e))
    for name, m in r["models"].items():
        typer.echo(
            f"{name:<14} HR@10 {m['sampled_hr@10']:.4f}  NDCG@10 {m['sampled_ndcg@10']:.4f}"
            f"  full Recall@10 {m['full_recall@10']:.4f}"
        )
    typer.echo(f"SASRec gap to paper: {r['gap_to_paper']}")


SAMPLING_HELP = (
    "greedy (one read-out per pair) or paper (T 0.7, top-p 0.8, top-k 20, --samples per pair; "
    "% positive over samples, as BRIEF)."
)


def _sampling_opt() -> Any:
    return typer.Option("greedy", "--sampling", help=SAMPLING_HELP)


def _dtype_opt() -> Any:
    return typer.Option(
        "auto",
        "--dtype",
        help="Judge compute dtype: auto (bf16 on CPUs with native bf16, else fp32), bfloat16 or "
        "float32. Results are stored per dtype: resume a run in the dtype it started with.",
    )


def _samples_opt() -> Any:
    return typer.Option(5, "--samples", min=1, help="Samples per pair with --sampling paper.")


def _config(cls: Any, **kw: Any) -> Any:
    """A bench config from options; a bad value is a one-line error naming the option."""
    from pydantic import ValidationError

    from recjudge.cli._app import option_errors

    try:
        return cls(**kw)
    except ValidationError as e:
        fail(option_errors(e))


def _names(text: str) -> tuple[str, ...]:
    """``"a, b,"`` -> ("a", "b")."""
    return tuple(s.strip() for s in text.split(",") if s.strip())


def _int_list(text: str | None, option: str) -> tuple[int, ...] | None:
    """``"0,1,2"`` -> (0, 1, 2); None stays None; anything else is a one-line error."""
    if text is None:
        return None
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        fail(f"{option} {text!r}: expected comma-separated whole numbers, e.g. {option} 0,1,2")
    raise AssertionError  # fail() exits


def _brief_config(model, data, users, seed, cf, bootstrap, **extra):
    from recjudge.bench import BriefExperimentConfig

    return _config(
        BriefExperimentConfig,
        model=model,
        data=data,
        users=users,
        seed=seed,
        cf=cf,
        bootstrap=bootstrap,
        **extra,
    )


@bench_app.command("brief-ratings")
def bench_brief_ratings_cmd(
    model: str = typer.Option("qwen2.5-coder-1.5b", "--model"),
    data: str = typer.Option("ml-1m", "--data"),
    users: int = typer.Option(30, "--users"),
    seed: int = typer.Option(0, "--seed"),
    cf: str = typer.Option("als", "--cf", help="CF model giving sigma."),
    beta: float = typer.Option(25.0, "--beta"),
    bootstrap: int = typer.Option(1000, "--bootstrap"),
    sampling: str = _sampling_opt(),
    dtype: str = _dtype_opt(),
    samples: int = _samples_opt(),
    out: str = typer.Option(None, "--out", help="Default: reports/brief-ratings/<data>-<model>."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """BRIEF Table 6: % positive rewards per held-out rating level, Spearman/Kendall, AUC."""
    from recjudge.bench import bench_brief_ratings
    from recjudge.cli._app import emit

    cfg = _brief_config(
        model,
        data,
        users,
        seed,
        cf,
        bootstrap,
        beta=beta,
        sampling=sampling,
        samples=samples,
        dtype=dtype,
    )
    r = bench_brief_ratings(cfg, out or f"reports/brief-ratings/{data}-{model}")
    if as_json:
        emit(r["modes"])
        return
    for name, a in r["modes"].items():
        typer.echo(
            f"{name:<28} rho {a['spearman']}  pair rho {a['pair_spearman']['rho']}  "
            f"AUC {a['relevance_auc']['auc']}"
        )


@bench_app.command("brief-beta")
def bench_brief_beta_cmd(
    model: str = typer.Option("qwen2.5-coder-1.5b", "--model"),
    data: str = typer.Option("ml-1m", "--data"),
    users: int = typer.Option(30, "--users"),
    seed: int = typer.Option(0, "--seed"),
    cf: str = typer.Option("als", "--cf"),
    sigma_source: str = typer.Option("positive", "--sigma-source", help="positive or all."),
    bootstrap: int = typer.Option(1000, "--bootstrap"),
    sampling: str = _sampling_opt(),
    dtype: str = _dtype_opt(),
    samples: int = _samples_opt(),
    out: str = typer.Option(None, "--out", help="Default: reports/brief-beta/<data>-<model>."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """BRIEF Figure 3: Spearman and relevance AUC against beta in {0, 5, ..., 40}."""
    from recjudge.bench import bench_brief_beta
    from recjudge.cli._app import emit

    cfg = _brief_config(
        model,
        data,
        users,
        seed,
        cf,
        bootstrap,
        sigma_source=sigma_source,
        sampling=sampling,
        dtype=dtype,
        samples=samples,
    )
    r = bench_brief_beta(cfg, out or f"reports/brief-beta/{data}-{model}")
    if as_json:
        emit(r["betas"])
        return
    for name, a in r["betas"].items():
        typer.echo(
            f"{name:<10} pair rho {a['pair_spearman']['rho']}  AUC {a['relevance_auc']['auc']}"
        )


@bench_app.command("brief-offline")
def bench_brief_offline_cmd(
    model: str = typer.Option("qwen2.5-coder-1.5b", "--model"),
    data: str = typer.Option("ml-1m", "--data"),
    users: int = typer.Option(30, "--users"),
    systems: str = typer.Option("pop,itemknn,als,bpr", "--systems"),
    alpha: float = typer.Option(1.0, "--alpha", help="Popularity exponent of the logging policy."),
    imputers: str = typer.Option(
        "brief,non-adaptive,no-behavior,zero-shot",
        "--imputers",
        help="Judge modes used as imputers (the CF imputer always runs).",
    ),
    cf: str = typer.Option("als", "--cf", help="CF imputer and sigma source: als, sasrec, bpr."),
    seed: int = typer.Option(0, "--seed"),
    logging_seeds: str = typer.Option(
        None,
        "--logging-seeds",
        help="Comma-separated seeds of the simulated logging policy, e.g. 0,1,2 (default: "
        "--seed); the report gives each seed's gap and the mean with a 95 % t-interval.",
    ),
    sampling: str = _sampling_opt(),
    dtype: str = _dtype_opt(),
    samples: int = _samples_opt(),
    out: str = typer.Option(None, "--out", help="Default: reports/brief-offline/<data>-<model>."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """BRIEF Tables 2-3: offline metrics with logged, CF-imputed and judge-imputed feedback."""
    from recjudge.bench import OfflineConfig, bench_brief_offline
    from recjudge.cli._app import emit

    cfg = _config(
        OfflineConfig,
        model=model,
        data=data,
        users=users,
        systems=tuple(s.strip() for s in systems.split(",")),
        alpha=alpha,
        judges=_names(imputers),
        cf=cf,
        seed=seed,
        logging_seeds=_int_list(logging_seeds, "--logging-seeds"),
        sampling=sampling,
        dtype=dtype,
        samples=samples,
    )
    r = bench_brief_offline(cfg, out or f"reports/brief-offline/{data}-{model}")
    if as_json:
        emit({"gap": r["gap"], "mean_gap": r["mean_gap"], "imputers": r["imputers"]})
        return
    for m, g in r["mean_gap"].items():
        typer.echo(f"{m:<22} mean gap {g}")


@bench_app.command("brief-augment")
def bench_brief_augment_cmd(
    model: str = typer.Option("qwen2.5-coder-1.5b", "--model"),
    data: str = typer.Option("ml-1m", "--data"),
    users: int = typer.Option(30, "--users"),
    candidates: int = typer.Option(8, "--candidates", help="N: top-N CF candidates per user."),
    add: int = typer.Option(2, "--add", help="M: positives added per user by every method."),
    retrain: str = typer.Option("als", "--retrain", help="Comma-separated: als, sasrec, bpr."),
    methods: str = typer.Option(
        None,
        "--methods",
        help="Comma-separated labelling methods (default: all, including the simulators, "
        "which write a persona per user first), e.g. none,random,popularity,cf-only,brief.",
    ),
    seeds: int = typer.Option(3, "--seeds"),
    seed: int = typer.Option(0, "--seed", help="User sampling seed."),
    sasrec_epochs: int = typer.Option(30, "--sasrec-epochs", help="Epochs per SASRec retrain."),
    score_from: str = typer.Option(
        "augmented",
        "--score-from",
        help="History a retrained model scores each user from: augmented (logged past, then "
        "the added items) or logged (the past alone; the added items shape training only).",
    ),
    workers: int = typer.Option(
        1,
        "--workers",
        min=1,
        help="Retrainings at once, each in its own process on one thread (same numbers; "
        "set it to the cores you can spare).",
    ),
    sampling: str = _sampling_opt(),
    dtype: str = _dtype_opt(),
    samples: int = _samples_opt(),
    out: str = typer.Option(None, "--out", help="Default: reports/brief-augment/<data>-<model>."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """BRIEF Tables 4-5: retrain recommenders on data augmented by each labelling method."""
    from recjudge.bench import AugmentBenchConfig, bench_brief_augment
    from recjudge.cli._app import emit

    cfg = _config(
        AugmentBenchConfig,
        model=model,
        data=data,
        users=users,
        candidates=candidates,
        add=add,
        retrain=tuple(s.strip() for s in retrain.split(",")),
        **({"methods": _names(methods)} if methods else {}),
        seeds=seeds,
        seed=seed,
        sasrec_epochs=sasrec_epochs,
        score_from=score_from,
        workers=workers,
        sampling=sampling,
        dtype=dtype,
        samples=samples,
    )
    r = bench_brief_augment(cfg, out or f"reports/brief-augment/{data}-{model}")
    if as_json:
        emit(r["table"])
        return
    for rec, by_method in r["table"].items():
        for m, v in by_method.items():
            typer.echo(f"{rec:<8} {m:<14} Recall@10 {v['recall@10']['mean']:.4f}")
    typer.echo(f"report: {out or f'reports/brief-augment/{data}-{model}'}/report.md")
