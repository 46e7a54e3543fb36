"""The user's jobs on their own files, each one typed config and one run function.

``impute`` (label the unlabelled top-k pairs of the user's runs), ``evaluate`` (metrics on
logged and imputed qrels, with estimators) and ``augment`` (pseudo-positives for retraining)
are registered in ``JOBS``: the command line builds ``recjudge impute / evaluate / augment``
from these configs' fields (one option per field, its description as help) and
``recjudge run NAME --config FILE`` runs the same config from a JSON file, so a job is
described once and rerun from what it saved.

A job config holds its evaluator's config (``ImputeConfig``, ``EvaluateConfig``,
``AugmentConfig``: what enters the results) plus where the inputs and outputs are and, for
the judging jobs, the judge's options (``JudgeOptions``). The run functions load and check
the inputs, build the judge and its store, run the evaluator and write the report; they raise
``ValueError`` / ``DataError`` / ``FileNotFoundError`` with the file and the fix, which the
command line prints as one line.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from recjudge._registry import Registry
from recjudge.evaluators._augment import AugmentConfig, augment
from recjudge.evaluators._evaluate import (
    QRELS_KINDS,
    EvaluateConfig,
    evaluate_runs,
    plot_scores,
    report_lines,
)
from recjudge.evaluators._impute import ImputeConfig, evaluation_users, impute, logged_qrels
from recjudge.evaluators._runs import RecRun, read_qrels, read_run, restrict_to
from recjudge.reporting import interval

__all__ = [
    "JOBS",
    "AugmentJob",
    "EvaluateJob",
    "ImputeJob",
    "JobSpec",
    "JudgeOptions",
    "estimator_lines",
    "parse_runs",
    "run_augment",
    "run_evaluate",
    "run_impute",
    "write_evaluation",
]

RUNS_HELP = (
    "Comma-separated run files (TREC, ranx JSON, JSONL/Parquet with user_id,item_id,score "
    "or rank), each optionally NAME=PATH."
)
Warn = Callable[[str], None]


class JudgeOptions(BaseModel):
    """The judge's options shared by ``impute`` and ``augment`` (``reward.build_judge``'s).

    Which of them enter a judgment's key is the judge's ``JudgeConfig`` business; ``resume``
    and ``allow_cf_mismatch`` only decide whether the job may go on.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = Field("qwen2.5-coder-0.5b", description="Judge LLM (preset, path or id).")
    cf: str | None = Field(None, description="A saved CF model folder (sigma source).")
    mode: str = Field(
        "brief", description="brief, non-adaptive, no-behavior, zero-shot, pub, agent4rec..."
    )
    beta: float = Field(25.0, description="Bias strength of the adaptive bias.")
    no_evidence: bool = Field(False, description="Stop at the decision step (labels only, faster).")
    batch_size: int | None = Field(
        None, ge=1, description="Pairs decoded together (default: all of a user's candidates, "
        "up to 64)."
    )  # fmt: skip
    max_history: int = Field(50, ge=1, description="History items the judge reads per user.")
    allow_cf_mismatch: bool = Field(
        False, description="Use a CF model trained on other data than --data."
    )
    resume: bool = Field(False, description="Continue OUT/store.sqlite (reuses finished pairs).")
    device: str = Field(
        "auto", description="In process: auto (CUDA when available), cpu, cuda or cuda:N."
    )


class ImputeJob(JudgeOptions, ImputeConfig):
    """``recjudge impute``: ``ImputeConfig`` plus the files and the judge."""

    data: str = Field(description="What the recommenders trained on (histories).")
    feedback: str = Field(description="Held-out logged feedback: a dataset name or folder.")
    runs: str = Field(description=RUNS_HELP)
    out: str = Field(description="Folder for qrels, imputed.jsonl, summary.")
    run_format: str = Field("auto", description="auto, trec, ranx, jsonl, parquet.")
    calibration: str | None = Field(
        None, description="A map from `recjudge calibrate` (made for this judge): adds "
        "p_calibrated."
    )  # fmt: skip


class EvaluateJob(EvaluateConfig):
    """``recjudge evaluate``: ``EvaluateConfig`` plus the runs, the qrels and the estimators'
    options."""

    runs: str = Field(description=RUNS_HELP)
    qrels: str | None = Field(
        None, description="An `impute` --out folder: logged and imputed qrels side by side."
    )
    feedback: str | None = Field(
        None, description="Without --qrels: held-out logged feedback (dataset)."
    )
    min_rating: float | None = Field(None, description="Logged relevance: rating >= this.")
    run_format: str = Field("auto", description="auto, trec, ranx, jsonl, parquet.")
    out: str | None = Field(None, description="Report folder (report.md, results.json, PNG).")
    estimators: str | None = Field(
        None,
        description="Also estimate with logged,imputed,dm,ips,snips,dr (needs --qrels; dm/dr "
        "need impute --judge-logged). Metrics precision/dcg/ndcg@K (all), hit/mrr@K (logged, "
        "imputed, dm).",
    )
    propensities: str = Field(
        "powerlaw:0.5",
        description="Observation propensities: a file (item_id,propensity or user_id,item_id,"
        "propensity) or powerlaw:EXP (Yang et al. 2018, from the logged labels' item counts).",
    )
    clip: float = Field(0.01, ge=1e-6, le=1.0, description="Propensity floor.")
    gold: str | None = Field(
        None,
        description="Gold pairs (user_id,item_id,label) drawn uniformly from the listed pairs: "
        "adds a prediction-powered (PPI++) estimate with an interval valid whatever the "
        "judge's bias.",
    )
    obp_out: str | None = Field(
        None,
        description="With --estimators: also write each run's lists as Open Bandit Pipeline "
        "inputs (one .npz per run and linear metric + index.json) for obp's DM/IPS/SNIPS/DR.",
    )
    note: str | None = Field(
        None, description="A paragraph for the report's header (protocol, deviations)."
    )


class AugmentJob(JudgeOptions, AugmentConfig):
    """``recjudge augment``: ``AugmentConfig`` plus the files and the judge."""

    data: str = Field(description="The training data to augment.")
    candidates: str = Field(description="A run file: candidates per user.")
    out: str = Field(description="The augmented dataset folder.")
    run_format: str = Field("auto", description="auto, trec, ranx, jsonl, parquet.")


def _sub(job: BaseModel, cls: type[BaseModel]) -> Any:
    """The part of ``job`` that is a ``cls`` (a job inherits its evaluator's fields)."""
    return cls(**{f: getattr(job, f) for f in cls.model_fields})


def parse_runs(spec: str, fmt: str) -> list[RecRun]:
    """``NAME=PATH,PATH,...`` -> the runs, read and checked (``read_run``)."""
    runs = []
    for part in [p.strip() for p in spec.split(",") if p.strip()]:
        name, _, path = part.rpartition("=") if "=" in part else ("", "", part)
        runs.append(read_run(path, fmt, name or None))
    if not runs:
        raise ValueError("--runs names no file; give one or more run files, comma-separated")
    return runs


def _warn_checks(runs: Sequence[RecRun], warn: Warn) -> None:
    for r in runs:
        problems = r.check.problems()
        if problems:
            warn(f"{r.path}: {problems} (rules: recjudge.evaluators._runs)")


def _judge_and_store(data: Any, opts: JudgeOptions, out: Path) -> tuple[Any, Any]:
    """The judge ``opts`` describe (checked against ``data``) and its store in ``out``."""
    from recjudge.cf_models import check_fits
    from recjudge.reward import ResultsStore, build_judge

    judge = build_judge(
        opts.model, opts.mode, opts.cf, opts.beta, not opts.no_evidence,
        batch_size=opts.batch_size, max_history=opts.max_history, dataset=data,
        device=opts.device,
    )  # fmt: skip
    if judge.cf is not None:
        check_fits(judge.cf, data, allow_mismatch=opts.allow_cf_mismatch)
    store_path = out / "store.sqlite"
    if store_path.exists() and not opts.resume:
        raise ValueError(
            f"{store_path} exists; pass --resume to continue it, or choose another --out"
        )
    out.mkdir(parents=True, exist_ok=True)
    return judge, ResultsStore(store_path)


def run_impute(job: ImputeJob, progress: bool = True, warn: Warn | None = None) -> dict[str, Any]:
    """Label every unlabelled (user, item) in the runs' top-k with the judge; write qrels
    (``impute``'s files in ``job.out``). Returns its summary."""
    from recjudge.data import load_dataset

    warn = warn or warnings.warn
    config = _sub(job, ImputeConfig)
    data, fb = load_dataset(job.data), load_dataset(job.feedback)
    recs = [restrict_to(r, data, job.k) for r in parse_runs(job.runs, job.run_format)]
    _warn_checks(recs, warn)
    judge, store = _judge_and_store(data, job, Path(job.out))
    cmap = None
    if job.calibration:
        from recjudge.evaluators._calibrate import load_map

        cmap = load_map(job.calibration, judge.config.model_dump(mode="json"))
    with store:
        return impute(judge, data, fb, recs, config, job.out, store=store, progress=progress,
                      calibration=cmap)  # fmt: skip


def impute_text(job: ImputeJob, s: dict[str, Any]) -> str:
    """``impute``'s one-line console summary."""
    per, imp = s["seconds_per_judged_pair"], s["reused_from_checkpoint"]
    return (
        f"{s['users']} users, {s['pairs']} unlabelled pairs: {s['imputed_yes']} YES, "
        f"{s['imputed_no']} NO, {s['failed']} failed, {s['reused']} from the store"
        f"{f' ({imp} of them from an imported checkpoint)' if imp else ''}"
        f"{f', {per} s per judged pair' if per else ''} -> {job.out}/qrels_imputed.trec"
    )


def run_evaluate(job: EvaluateJob, progress: bool = True, warn: Warn | None = None) -> dict:
    """Metrics per system on logged-only and on imputed feedback, paired tests, the systems'
    order under each, and the estimators when asked; the report goes to ``job.out``."""
    config = _sub(job, EvaluateConfig)  # what enters results.json's config
    recs = parse_runs(job.runs, job.run_format)
    if job.qrels:
        if not (Path(job.qrels) / "qrels_imputed.json").exists():
            raise ValueError(
                f"{job.qrels} holds no qrels_logged.json / qrels_imputed.json; --qrels takes "
                "the --out folder of `recjudge impute`"
            )
        q = {kind: read_qrels(Path(job.qrels) / f"qrels_{kind}.json") for kind in QRELS_KINDS}
        users = sorted(q["imputed"])
    elif job.feedback:
        from recjudge.data import load_dataset

        q = {"logged": logged_qrels(load_dataset(job.feedback), job.min_rating)}
        users = evaluation_users(recs, q["logged"])
    else:
        raise ValueError("give --qrels DIR (from `recjudge impute`) or --feedback DATA")
    res = evaluate_runs(q, recs, users, config)
    if job.estimators:
        res["estimators"] = _estimate(job, q, recs, users, config)
    elif job.gold or job.obp_out:
        flag = "--gold" if job.gold else "--obp-out"
        raise ValueError(f"{flag} goes with --estimators (e.g. --estimators dm,dr)")
    if job.out:
        write_evaluation(res, recs, job, job.out)
    return res


def evaluate_text(job: EvaluateJob, res: dict[str, Any]) -> str:
    """``evaluate``'s console report: the metric tables, then the estimators'."""
    lines = report_lines(res, [])
    if "estimators" in res:
        lines += estimator_lines(res["estimators"])
    return "\n".join(lines)


def _estimate(job: EvaluateJob, q: dict, recs: list[RecRun], users: list[str], config: Any):
    """``evaluate --estimators``: the options checked, then ``estimate_evaluation`` (and the
    obp export)."""
    from recjudge._registry import suggest
    from recjudge.evaluators._estimators import (
        ESTIMATORS,
        RANX_NAMES,
        estimate_evaluation,
        export_obp,
        propensities_from,
        read_gold,
        read_judged,
    )

    wanted = [e.strip() for e in (job.estimators or "").split(",") if e.strip()]
    bad = [e for e in wanted if e not in ESTIMATORS]
    if bad:
        close = suggest(bad[0], list(ESTIMATORS))
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"--estimators: unknown {bad[0]!r}{hint}; use {', '.join(ESTIMATORS)}")
    if not job.qrels:
        raise ValueError("--estimators needs --qrels DIR (an impute --out folder: its "
                         "imputed.jsonl holds the judge's probabilities)")  # fmt: skip
    props = propensities_from(job.propensities, q["logged"], job.clip)
    judged = read_judged(Path(job.qrels) / "imputed.jsonl")
    metrics = [
        f"{RANX_NAMES[base]}@{cut or config.k}"
        for base, _, cut in (m.partition("@") for m in config.metrics)
        if base in RANX_NAMES
    ] or [f"ndcg@{config.k}"]
    summary = Path(job.qrels) / "summary.json"
    calibrated = bool(summary.exists() and json.loads(summary.read_text()).get("calibrated"))
    pairs = None
    if job.gold:
        k = max(int(m.partition("@")[2]) for m in metrics)
        listed = {(u, i) for r in recs for u in users for i in r.rankings.get(u, [])[:k]}
        pairs = read_gold(job.gold, users, listed)
    got = estimate_evaluation(
        recs, q["logged"], judged, props, users, metrics, wanted,
        calibrated=calibrated, gold=pairs, gold_name=Path(job.gold or "").name,
    )  # fmt: skip
    if job.obp_out:
        files = export_obp(recs, q["logged"], judged, props, users, metrics, job.obp_out)
        got["obp_export"] = {"folder": str(job.obp_out), "files": len(files)}
    return got


def estimator_lines(est: dict) -> list[str]:
    """The estimator table: per system and metric, each estimator with its 95 % user
    bootstrap interval and the share of the metric the judge decides."""
    lines = ["", "## Estimators", "", f"- propensities: {est['propensity']} "
             f"({est['clipped']} lookups clipped)", f"- calibration: {est['calibration']}",
             f"- gold sample: {est['gold']}", "",
             "| system | metric | estimator | value [95 % CI] | judge share |",
             "|---|---|---|---|---|"]  # fmt: skip
    for system, by_metric in est["systems"].items():
        for metric, by_est in by_metric.items():
            for name, e in by_est.items():
                if e["value"] is None:
                    shown = f"undefined ({e['note']})"
                else:
                    shown = interval(e["value"], *(e["ci"] or (None, None)), nd=4)
                lines.append(f"| {system} | {metric} | {name} | {shown} | "
                             f"{e['judge_share']:.2f} |")  # fmt: skip
    return lines


def write_evaluation(res: dict[str, Any], recs: Sequence[RecRun], job: EvaluateJob, out: str):
    """``evaluate``'s report folder: report.md, results.json (with the job, so ``recjudge run
    evaluate --config results.json`` reruns it), evaluate.png."""
    from recjudge.reporting import write_report

    source, note = job.qrels or job.feedback or "", job.note
    header = [
        "# Offline evaluation: logged-only vs imputed feedback",
        "",
        f"Systems: {', '.join(f'{r.name} ({r.path})' for r in recs)}. Qrels: {source}.",
        *(["", note] if note else []),
    ]
    lines = report_lines(res, header)
    if "estimators" in res:
        lines += estimator_lines(res["estimators"])
    runs = {r.name: r.path for r in recs}
    write_report(out, {**res, "runs": runs, "job": job.model_dump(mode="json")}, lines)
    plot_scores(res, Path(out) / "evaluate.png")


def run_augment(job: AugmentJob, progress: bool = True, warn: Warn | None = None) -> dict:
    """Add the judge's top-M YES candidates per user as pseudo-positives; the augmented
    dataset goes to ``job.out`` (``cf train`` reads it), the judge's store beside it."""
    from recjudge.data import load_dataset

    warn = warn or warnings.warn
    data = load_dataset(job.data)
    run = restrict_to(read_run(job.candidates, job.run_format), data)
    _warn_checks([run], warn)
    judge, store = _judge_and_store(data, job, Path(f"{job.out}.judge"))
    with store:
        return augment(judge, data, run, _sub(job, AugmentConfig), job.out, store=store,
                       progress=progress)  # fmt: skip


def augment_text(job: AugmentJob, s: dict[str, Any]) -> str:
    """``augment``'s one-line console summary."""
    per = s["seconds_per_judged_pair"]
    return (
        f"{s['users']} users, {s['candidates']} candidates: {s['yes']} YES, {s['added']} added "
        f"(per user: {json.dumps(s['added_per_user'])}), {s['failed']} failed"
        f"{f', {per} s per judged pair' if per else ''} -> {job.out}"
    )


@dataclass(frozen=True)
class JobSpec:
    """One job on the user's files.

    Attributes:
        config: its frozen config class; the command line's options are its fields.
        run: ``run(config, progress=..., warn=...) -> results``.
        text: ``text(config, results)``, the results as the console shows them.
        summary: one line for ``recjudge jobs``.
    """

    config: type[BaseModel]
    run: Callable[..., dict[str, Any]]
    text: Callable[[Any, dict[str, Any]], str]
    summary: str


JOBS: Registry[JobSpec] = Registry("job")
JOBS.register(
    "impute",
    JobSpec(
        ImputeJob,
        run_impute,
        impute_text,
        "Label every unlabelled (user, item) in the runs' top-k with the judge; write qrels.",
    ),
)
JOBS.register(
    "evaluate",
    JobSpec(
        EvaluateJob,
        run_evaluate,
        evaluate_text,
        "Metrics per system on logged-only and imputed feedback, with estimators and intervals.",
    ),
)
JOBS.register(
    "augment",
    JobSpec(
        AugmentJob,
        run_augment,
        augment_text,
        "Add the judge's top-M YES candidates per user as pseudo-positives (`cf train` reads it).",
    ),
)
