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

import contextlib
import json
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from recjudge._judge_options import JUDGE_SUMMARY, JudgeJob, JudgeOptions, Warn
from recjudge._registry import Registry, suggest
from recjudge._util import atomic_write_json, json_loads, keep_as_backup
from recjudge.data import DataError, load_dataset, read_table
from recjudge.distributed import ray_executor
from recjudge.evaluators._circular import (
    circular_systems,
    gold_leniency,
    judge_by_system,
    lenient_systems,
    list_overlap,
    refuse_circular,
    related_systems,
    sigma_source,
)
from recjudge.evaluators.offline._augment import AugmentConfig, augment
from recjudge.evaluators.offline._calibrate import load_map
from recjudge.evaluators.offline._estimators import ESTIMATORS, parse_metric
from recjudge.evaluators.offline._evaluate import (
    QRELS_KINDS,
    EvaluateConfig,
    evaluate_runs,
    plot_scores,
    report_lines,
)
from recjudge.evaluators.offline._evaluation import (
    FRAGILE_TOP_SHARE,
    MIN_ESS,
    RANX_NAMES,
    estimate_evaluation,
    read_judged,
)
from recjudge.evaluators.offline._gold import (
    check_redraw,
    listed_pairs,
    order_record,
    read_gold,
    sample_gold,
    write_gold,
)
from recjudge.evaluators.offline._impute import (
    ITEM_POPULARITY,
    JUDGE_CF_LISTS,
    ImputeConfig,
    circular_check,
    evaluation_users,
    imputation_plan,
    impute,
    logged_qrels,
    read_item_popularity,
)
from recjudge.evaluators.offline._judge_job import judge_of, judge_text, run_judge
from recjudge.evaluators.offline._obp import export_obp
from recjudge.evaluators.offline._ppi import gold_units_needed
from recjudge.evaluators.offline._propensities import propensities_from
from recjudge.evaluators.offline._runs import RecRun, read_qrels, read_run, restrict_to
from recjudge.evaluators.offline._supervised import fit_imputer, read_feature_rows, refit_draws
from recjudge.evaluators.offline._transport import (
    MIN_PASS_USERS,
    MIN_TRANSPORT_USERS,
    POWER,
    TRANSPORT_MARGIN,
)
from recjudge.evaluators.offline._verdict import (
    LEAD_RULE,
    Advice,
    choose_lead,
    judge_spread,
    verdict_lines,
    verdict_table,
)
from recjudge.evaluators.offline._worth import worth_lines
from recjudge.reporting import interval, write_report
from recjudge.reward import JudgeConfig, ResultsStore
from recjudge.tune import (
    TunedLeakageError,
    TuneJob,
    gold_overlap,
    period_overlap,
    refuse_gold,
    refuse_period,
    run_tune,
    tune_text,
)

__all__ = [
    "JOBS",
    "AugmentJob",
    "EvaluateJob",
    "GoldSampleJob",
    "ImputeJob",
    "JobSpec",
    "JudgeJob",
    "JudgeOptions",
    "estimator_lines",
    "parse_runs",
    "run_augment",
    "run_evaluate",
    "run_gold_sample",
    "run_impute",
    "run_judge",
    "write_evaluation",
]

RUNS_HELP = (
    "Comma-separated run files (TREC, ranx JSON, JSONL/Parquet with user_id,item_id,score "
    "or rank), each optionally NAME=PATH."
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
    allow_circular: bool = Field(
        False, description="Go on when the judge's CF signal is one of the runs (its imputed "
        "metric is then inflated; the report names it)."
    )  # fmt: skip
    allow_tuned_overlap: bool = Field(
        False, description="Go on when the judge was tuned (`judge tune`) on the evaluated "
        "users' held-out period (the report names it)."
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
        description="Estimators, comma-separated, of logged,imputed,dm,ips,snips,dr (default "
        "with --qrels: all six, the validated one first: dr, or snips without the judge's "
        "probability for logged pairs). Metrics precision/ndcg@K (all; the estimators' nDCG is "
        "ndcg_fixed), hit_rate/mrr@K (logged, imputed, dm).",
    )
    propensities: str = Field(
        "fit",
        description="Observation propensities: fit (a power law of training popularity fitted "
        "to the log by maximum likelihood), powerlaw:EXP (fixed exponent of the logged counts, "
        "Yang et al. 2018) or a file (item_id,propensity or user_id,item_id,propensity).",
    )
    clip: float = Field(0.01, ge=1e-6, le=1.0, description="Propensity floor.")
    gold: str | None = Field(
        None,
        description="Gold pairs (`recjudge gold sample`'s file, labelled; or user_id,item_id,"
        "label drawn uniformly from the listed pairs): adds a prediction-powered (PPI++) "
        "estimate with an interval valid whatever the judge's bias, clustered by user.",
    )
    calibration: Literal["isotonic", "logistic", "boosting"] | None = Field(
        None, description="With --gold: fit the judge's probabilities to the gold labels, "
        "cross-fitted over users: isotonic (p_yes alone), logistic or boosting (the supervised "
        "imputer: the judge's log-odds, sigma, item popularity, history length, evidence). DM, "
        "DR and PPI then use it."
    )  # fmt: skip
    ppi_intervals: Literal["auto", "iid"] = Field(
        "auto", description="auto: users as clusters whenever a user holds 2+ gold pairs (or "
        "the users design); iid: every gold pair independent (for comparison)."
    )  # fmt: skip
    transport_margin: float = Field(
        TRANSPORT_MARGIN, gt=0, le=1, description="With --calibration: the transport check's "
        "equivalence margin on the calibration's mean residual per gold pair (on precision@k, "
        "the calibrated level's bias): pass when its 90 % interval lies within it."
    )  # fmt: skip
    allow_circular: bool = Field(
        False, description="Go on when the judge's CF signal is one of the runs (its imputed "
        "metric is then inflated; the report header names it)."
    )  # fmt: skip
    allow_tuned_overlap: bool = Field(
        False, description="Go on when the judge was tuned (`judge tune`) on users of the "
        "gold sample (the report names it)."
    )  # fmt: skip
    obp_out: str | None = Field(
        None,
        description="With --estimators: also write each run's lists as Open Bandit Pipeline "
        "inputs (one .npz per run and linear metric + index.json) for obp's DM/IPS/SNIPS/DR.",
    )
    note: str | None = Field(
        None, description="A paragraph for the report's header (protocol, deviations)."
    )


class GoldSampleJob(BaseModel):
    """``recjudge gold sample``: pairs for a person to label from the evaluated lists."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    runs: str = Field(description=RUNS_HELP)
    qrels: str = Field(description="The `recjudge impute` --out folder (its evaluation users; "
                       "the judge's p_yes for the stratified design).")  # fmt: skip
    out: str = Field(description="The CSV to label (label column empty) + OUT.design.json.")
    n: int = Field(200, ge=2, description="Pairs to label (users design: at least this many).")
    k: int = Field(10, ge=1, description="The top-k that evaluate scores.")
    # uniform by default: its PPI interval held 96-97 % at 300 and 1,000 gold pairs where the
    # users design's held 93-94 % and was refused at 100 (scripts/gold_design_coverage.py,
    # reports/gold-design-coverage), and it is the narrower of the two at every size
    design: Literal["users", "uniform", "stratified", "active"] = Field(
        "uniform", description="uniform (pairs drawn uniformly from the listed pairs; the "
        "default), users (every listed pair of sampled users: clustered PPI), stratified (by "
        "system and judge-score quartile, 1/pi weighted), active (pairs drawn more where the "
        "judge is unsure, about n, 1/pi weighted)."
    )  # fmt: skip
    seed: int = Field(0, description="The sample's seed.")
    sequential: bool = Field(
        False, description="users (uniform, stratified, active) design: every evaluation "
        "user (listed pair) in a random order (stratified: the strata in turn; active: "
        "priority sampling, pairs the judge is unsure of earlier); label from the top (whole "
        "users, or pairs) and evaluate any time: the report says whether to stop (--n: the "
        "first batch to label)."
    )  # fmt: skip
    data: str | None = Field(
        None, description="The dataset the judge read (adds titles and recent history for "
        "the labeller)."
    )  # fmt: skip
    run_format: str = Field("auto", description="auto, trec, ranx, jsonl, parquet.")
    force: bool = Field(
        False, description="Write over an existing --out file; the old file (and its design "
        "record) is kept beside it as OUT.bak-N first."
    )  # fmt: skip


def run_gold_sample(job: GoldSampleJob, progress: bool = True, warn: Warn | None = None) -> dict:
    """Draw ``job.n`` pairs under ``job.design`` (``_gold.sample_gold``) and write the
    labeller's CSV and its design record. An existing ``--out`` is a file a person may have
    labelled: refused unless ``force``, which backs it up first (``_keep_labelled``)."""
    out = Path(job.out)
    if out.is_dir():
        raise ValueError(f"--out {out} is a folder; give the CSV file to write, e.g. "
                         f"{out / 'gold.csv'}")  # fmt: skip
    backup = _keep_labelled(out, job.force)
    recs = parse_runs(job.runs, job.run_format)
    qrels = Path(job.qrels) / "qrels_imputed.json"
    if not qrels.is_file():
        raise ValueError(f"{job.qrels} holds no qrels_imputed.json; --qrels takes the --out "
                         "folder of `recjudge impute`")  # fmt: skip
    users = sorted(read_qrels(qrels))
    judged = None
    if job.design in ("stratified", "active"):
        judged = read_judged(Path(job.qrels) / "imputed.jsonl")
    rows = sample_gold(recs, users, job.k, job.n, design=job.design, seed=job.seed,
                       judged=judged, sequential=job.sequential)  # fmt: skip
    data = None
    if job.data:
        data = load_dataset(job.data)
    design = {
        "design": job.design,
        "seed": job.seed,
        "k": job.k,
        "n": job.n,
        "runs": {r.name: r.path for r in recs},
        "evaluation_users": len(users),
    }
    first = None
    if job.sequential:  # the order the labeller follows, and the first batch to label
        design |= {"sequential": True, "order": order_record(job.design, rows)}
        # a stratified prefix is read once it holds a pair of every stratum
        least = len({r["stratum"] for r in rows}) if job.design == "stratified" else 1
        first = rows[min(max(job.n, least), len(rows)) - 1]["order"]
    write_gold(rows, out, design, data)
    return {"pairs": len(rows), "users": len({r["user_id"] for r in rows}), "design": job.design,
            "out": str(out), "design_record": f"{out}.design.json",
            "first_batch_users": first, "backup": backup}  # fmt: skip


def _keep_labelled(out: Path, force: bool) -> str | None:
    """Refuse to write over ``out`` (a gold file: hours of a person's labelling) unless
    ``force``; with it, move ``out`` and its design record to the first free ``OUT.bak-N``
    and return that path. Nothing is deleted either way."""
    if not out.exists():
        return None
    labelled = None
    # not a table: refused all the same, without a count
    with contextlib.suppress(DataError, OSError, ValueError, UnicodeDecodeError):
        labelled = sum(1 for v in read_table(out).get("label", []) if str(v).strip())
    what = f" ({labelled} labelled rows)" if labelled is not None else ""
    if not force:
        raise ValueError(f"--out {out} exists{what}: a gold file a person labels is never "
                         "written over; give another --out, or --force to write it anew "
                         f"(the old file is kept as {out}.bak-N)")  # fmt: skip
    return str(keep_as_backup(out, (".design.json",)))


def gold_text(job: GoldSampleJob, s: dict[str, Any]) -> str:
    """``gold sample``'s one-line summary."""
    if s.get("first_batch_users"):
        users = job.design == "users"
        what = "whole users" if users else "pairs"
        batch = f": about {job.n} pairs" if users else ""
        return (
            f"{s['pairs']} pairs of {s['users']} users in a random order (sequential "
            f"{job.design} design) -> {s['out']}: label {what} from the top (order 1 to "
            f"{s['first_batch_users']} first{batch}), then `recjudge evaluate ... "
            f"--gold {s['out']}`; its next step says whether to stop or how far to go on"
        )
    return (
        f"{s['pairs']} pairs of {s['users']} users ({s['design']} design) -> {s['out']}: "
        "fill its label column with 0/1, then `recjudge evaluate ... --gold "
        f"{s['out']}`"
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
    """``NAME=PATH,PATH,...`` -> the runs, read and checked (``read_run``). ``NAME`` is what
    precedes the first ``=`` (a path may hold ``=``; a name holds no ``/``): a part that is an
    existing file, or whose text before the first ``=`` holds a path separator, is a path
    alone."""
    runs = []
    for part in [p.strip() for p in spec.split(",") if p.strip()]:
        name, eq, path = part.partition("=")
        if not eq or Path(part).is_file() or "/" in name or "\\" in name:
            name, path = "", part
        runs.append(read_run(path, fmt, name or None))
    if not runs:
        raise ValueError("--runs names no file; give one or more run files, comma-separated")
    return runs


def _warn_checks(runs: Sequence[RecRun], warn: Warn) -> None:
    for r in runs:
        problems = r.check.problems()
        if problems:
            warn(f"{r.path}: {problems} (rules: recjudge.evaluators.offline._runs)")


def _judge_and_store(
    data: Any, opts: JudgeOptions, out: Path, before_store: Callable[[Any], None] | None = None
) -> tuple[Any, Any]:
    """The judge ``opts`` describe (checked against ``data``) and its store in ``out``;
    ``before_store(judge)`` runs first (a refusal there leaves no store behind)."""
    executor = ray_executor(opts.ray_config(), opts.model, "transformers", None, opts.device)
    judge = judge_of(opts, data, executor)
    if before_store is not None:
        before_store(judge)
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
    warn = warn or warnings.warn
    config = _sub(job, ImputeConfig)
    data, fb = load_dataset(job.data), load_dataset(job.feedback)
    recs = [restrict_to(r, data, job.k) for r in parse_runs(job.runs, job.run_format)]
    _warn_checks(recs, warn)
    source = sigma_source(job.cf, JudgeConfig(mode=job.mode).uses_cf(), data.name)
    plan = imputation_plan(data, fb, recs, config)
    tuned = period_overlap(job.model, fb, plan.users)  # refused before a store exists
    refuse_period(tuned, job.model, job.allow_tuned_overlap)
    found: dict[str, Any] = {}

    def circular(judge: Any) -> None:  # refused before a store exists
        found.update(circular_check(judge, data, recs, plan.users, config.k, source,
                                    job.allow_circular))  # fmt: skip

    judge, store = _judge_and_store(data, job, Path(job.out), circular)
    cmap = None
    if job.calibration:
        cmap = load_map(job.calibration, judge.config.model_dump(mode="json"))
    with store:
        summary = impute(judge, data, fb, recs, config, job.out, store=store,
                         progress=progress, calibration=cmap, sigma_source=source, plan=plan,
                         circular=found, allow_circular=job.allow_circular)  # fmt: skip
    if tuned is not None:  # what evaluate's header and gold check read
        summary["tuned"] = {
            **tuned,
            "model": job.model,
            "allowed": bool(job.allow_tuned_overlap and tuned["period_overlap"]),
        }
        atomic_write_json(Path(job.out) / "summary.json", summary)
    write_impute_report(job, summary)
    return summary


def write_impute_report(job: ImputeJob, s: dict[str, Any]) -> None:
    """``impute``'s report.md / report.html / results.json (the summary with the job): what
    was judged, by which judge, with what outcome, and the next command."""
    j = s.get("judge") or {}
    circ = f"CIRCULAR JUDGE allowed for {', '.join(s['circular'])}. " if s.get("circular") else ""
    lines = [
        "# Imputed feedback: the judge's labels for the unlabelled top-k pairs",
        "",
        f"Judge `{j.get('model')}` ({j.get('mode')}, beta {j.get('beta')}, prompt "
        f"{s.get('prompt_version')}); sigma source: "
        f"{(s.get('sigma_source') or {}).get('folder', 'none')}. "
        f"{circ}"
        "These labels are the BRIEF paper's protocol (biased as a metric by itself); "
        "`recjudge evaluate --qrels` uses them with the estimators.",
        "",
        "| quantity | value |",
        "|---|---|",
        *(f"| {k} | {s.get(k)} |" for k in ("users", "pairs", "judged_now", "reused",
          "reused_from_checkpoint", "failed", "imputed_yes", "imputed_no", "judged_logged",
          "logged_labels_in_topk", "seconds_per_judged_pair")),
        "",
        "| run | path |",
        "|---|---|",
        *(f"| {name} | `{r.get('path')}` |" for name, r in (s.get("runs") or {}).items()),
        "",
        f"Next: `recjudge evaluate --runs {job.runs} --qrels {job.out} --k {job.k}`.",
    ]  # fmt: skip
    write_report(job.out, {**s, "job": job.model_dump(mode="json")}, lines)


def impute_text(job: ImputeJob, s: dict[str, Any]) -> str:
    """``impute``'s one-line console summary."""
    per, imp = s["seconds_per_judged_pair"], s["reused_from_checkpoint"]
    circ = (f"; CIRCULAR JUDGE allowed for {', '.join(s['circular'])}"
            if s.get("circular") else "")  # fmt: skip
    return (
        f"{s['users']} users, {s['pairs']} pairs ({s['judged_logged']} logged, judged for "
        f"dm/dr): {s['imputed_yes']} YES, "
        f"{s['imputed_no']} NO, {s['failed']} failed, {s['reused']} from the store"
        f"{f' ({imp} of them from an imported checkpoint)' if imp else ''}"
        f"{f', {per} s per judged pair' if per else ''} -> {job.out}/qrels_imputed.trec{circ}"
    )


#: fewer evaluation users than this: a warning line (intervals over few users are rough)
FEW_USERS = 30


def run_evaluate(job: EvaluateJob, progress: bool = True, warn: Warn | None = None) -> dict:
    """Metrics per system on logged-only and on imputed feedback, each with a 95 % user
    bootstrap interval and paired differences between systems, and (with ``--qrels``) the
    estimators, the validated one first; the report goes to ``job.out``.

    Raises:
        CircularJudgeError: the judge's CF signal (``impute``'s summary) is one of the runs,
            without ``allow_circular``.
    """
    warn = warn or warnings.warn
    config = _sub(job, EvaluateConfig)  # what enters results.json's config
    recs = parse_runs(job.runs, job.run_format)
    summary: dict[str, Any] = {}
    if job.qrels:
        if not (Path(job.qrels) / "qrels_imputed.json").exists():
            raise ValueError(
                f"{job.qrels} holds no qrels_logged.json / qrels_imputed.json; --qrels takes "
                "the --out folder of `recjudge impute`"
            )
        q = {kind: read_qrels(Path(job.qrels) / f"qrels_{kind}.json") for kind in QRELS_KINDS}
        users = sorted(q["imputed"])
        summary = _impute_summary(Path(job.qrels))
        _require_imputed(recs, q["imputed"], users, config.k, job, summary)
    elif job.feedback:
        feedback = load_dataset(job.feedback)
        recs = [_known_users(r, feedback, warn) for r in recs]
        q = {"logged": logged_qrels(feedback, job.min_rating)}
        users = evaluation_users(recs, q["logged"])
    else:
        raise ValueError("give --qrels DIR (from `recjudge impute`) or --feedback DATA")
    circular = _circular_runs(summary, recs, job.allow_circular)
    by_system = _judge_by_system(job, q, recs, users, config) if job.qrels else {}
    related: dict[str, str] = {}
    if summary.get("sigma_source"):  # a judge with a CF signal: is it lenient to one system?
        lenient = lenient_systems(by_system)
        # what the judge did on each system's lists, whatever the run files are called
        refused, related = related_systems(by_system, _overlap_by_lists(job, recs, users))
        refuse_circular({**lenient, **refused}, job.allow_circular)
        circular = {**circular, **lenient, **refused}
        for name, why in related.items():
            warn(f"related judge: {name}: {why}")
    res = evaluate_runs(q, recs, users, config)
    res["circular"] = circular
    res["related"] = related
    if summary.get("judge"):  # who imputed the labels (report header, MLflow tags)
        res["judge"] = summary["judge"]
        res["prompt_version"] = summary.get("prompt_version")
    if len(users) < FEW_USERS:
        res["few_users"] = (f"only {len(users)} evaluation users (< {FEW_USERS}): every "
                            "interval is rough; impute more users (--users)")  # fmt: skip
        warn(res["few_users"])
    if job.qrels:
        res["estimators"] = _estimate(job, q, recs, users, config, summary)
        res["verdicts"] = res["estimators"].pop("verdicts")
        gold = res["estimators"].pop("_gold", None)
        if related and gold is not None:  # a related model: do the gold labels show it?
            shown = gold_leniency(list(related), recs, users, config.k, gold[1], gold[0])
            refuse_circular(shown, job.allow_circular)
            res["circular"] = {**res["circular"], **shown}
        res["judge_by_system"] = by_system
        if summary.get("tuned"):  # after _estimate: its gold check adds to it
            res["tuned"] = summary["tuned"]
    elif job.estimators or job.gold or job.obp_out:
        flag = "--estimators" if job.estimators else "--gold" if job.gold else "--obp-out"
        raise ValueError(f"{flag} needs --qrels DIR (an impute --out folder: its imputed.jsonl "
                         "holds the judge's probabilities)")  # fmt: skip
    else:
        res["verdicts"] = _logged_verdicts(res, recs, users, config.k, job.runs)
    if job.out:
        write_evaluation(res, recs, job, job.out)
    return res


def _logged_verdicts(res: dict[str, Any], recs: Sequence[RecRun], users: Sequence[str], k: int,
                     runs: str) -> dict[str, Any]:  # fmt: skip
    """The verdict table of an evaluation on logged feedback alone (no judge): ranx's metrics,
    an unlabelled pair taken as irrelevant, so without guarantee."""
    leads = {m: {"estimator": "logged", "metric": m, "guarantee": False,
                 "why": "logged feedback alone (--feedback, no --qrels): an unlabelled listed "
                        "pair counts as irrelevant, WITHOUT GUARANTEE for systems the log did "
                        "not show; impute and evaluate with --qrels for the estimators"}
             for m in res["metrics"]}  # fmt: skip
    diffs = {m: {"logged": d} for m, d in (res.get("differences") or {}).get("logged", {}).items()}
    return verdict_table(diffs, leads, recs, users, {}, Advice(runs, None, k))


def _known_users(run: RecRun, data: Any, warn: Warn) -> RecRun:
    """``run`` without the users ``data`` (the held-out feedback) does not know, counted in
    its check and said once, as ``impute`` does against its ``--data``: a user id no log
    holds (a typo, another dataset's id) is no evaluation user."""
    known = set(data.interactions["user_id"].astype(str).unique())
    if data.users is not None and "user_id" in data.users:
        known |= set(data.users["user_id"].astype(str))
    unknown = [u for u in run.rankings if u not in known]
    if not unknown:
        return run
    for u in unknown:
        run.check.note("unknown_users", repr(u))
    if len(unknown) == len(run.rankings):
        raise DataError(f"no user of run {run.name!r} is in the feedback data.",
                        source=run.path, fix="pass the --feedback split of the data the "
                        "recommender was trained on (the user ids must match)")  # fmt: skip
    warn(f"{run.path}: {len(unknown)} users the feedback data does not know are left out "
         f"(e.g. {unknown[0]!r}); they are not evaluation users")  # fmt: skip
    keep = {u: v for u, v in run.rankings.items() if u in known}
    return RecRun(run.name, run.path, keep, {u: run.scores[u] for u in keep}, run.check,
                  run.provenance)  # fmt: skip


def _require_imputed(recs: Sequence[RecRun], imputed: dict[str, dict[str, int]],
                     users: Sequence[str], k: int, job: EvaluateJob,
                     summary: dict[str, Any]) -> None:  # fmt: skip
    """Refuse a run whose top-k lists hold pairs the imputed qrels lack (neither logged nor
    judged: a run added after ``impute``, a larger ``--k``, or judgments that failed): its
    metric would count them as irrelevant, and the comparison is silently wrong."""
    for run in recs:
        missing = [(u, i) for u in users for i in run.rankings.get(u, [])[:k]
                   if i not in imputed.get(u, {})]  # fmt: skip
        if not missing:
            continue
        listed = sum(len(run.rankings.get(u, [])[:k]) for u in users)
        judged_k = (summary.get("config") or {}).get("k")
        why = (f"impute judged the top-{judged_k} and evaluate reads the top-{k}"
               if isinstance(judged_k, int) and judged_k < k else
               f"{run.name!r} was not among impute's --runs, or judgments of its pairs "
               "failed")  # fmt: skip
        u, i = missing[0]
        raise DataError(
            f"run {run.name!r} ({run.path}) lists {len(missing)} of its {listed} top-{k} "
            f"pairs of the {len(users)} evaluation users that {job.qrels} neither logged nor "
            f"judged (e.g. user {u!r}, item {i!r}): {why}; its metric would count them as "
            "irrelevant.",
            source=str(Path(job.qrels or "") / "qrels_imputed.json"),
            fix=f"judge them: `recjudge impute --runs {job.runs} --k {max(k, judged_k or k)} "
                f"--out {job.qrels} --resume` with impute's other options as before (finished "
                "pairs are reused, only the new ones are judged), then evaluate again",
        )  # fmt: skip


def _overlap_by_lists(job: EvaluateJob, recs: Sequence[RecRun],
                      users: Sequence[str]) -> dict[str, float] | None:  # fmt: skip
    """Per run, the share of its top-k that the judge's CF model's own top-k holds
    (``impute`` wrote those lists beside the qrels), for every run evaluated now; None
    when the folder holds no such lists (an older impute)."""
    path = Path(job.qrels or "") / JUDGE_CF_LISTS
    if not path.is_file():
        return None
    try:
        own = json_loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise DataError("not the judge's CF lists (JSON).", source=str(path),
                        fix="run `recjudge impute` into this folder again") from None  # fmt: skip
    if not isinstance(own, dict):
        return None
    return list_overlap(recs, {str(u): [str(i) for i in v] for u, v in own.items()
                               if isinstance(v, list)}, users, job.k)  # fmt: skip


def _impute_summary(folder: Path) -> dict[str, Any]:
    path = folder / "summary.json"
    if not path.is_file():
        return {}
    try:
        got = json_loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise DataError(
            "not impute's summary (JSON).",
            source=str(path),
            fix="run `recjudge impute` into this folder again",
        ) from None
    return got if isinstance(got, dict) else {}


def _circular_runs(summary: dict[str, Any], recs: Sequence[RecRun], allow: bool) -> dict:
    """``_circular``'s rule on the runs evaluated now, from what ``impute`` recorded (its
    judge's sigma source and its CF model's overlap with each run, by run path or name)."""
    source = summary.get("sigma_source")
    recorded = summary.get("overlap_with_judge_cf") or {}
    paths = {name: (r or {}).get("path") for name, r in (summary.get("runs") or {}).items()}
    overlap = {}
    for run in recs:
        for name, v in recorded.items():
            if name == run.name or paths.get(name) == run.path:
                overlap[run.name] = float(v)
    found = circular_systems(source, recs, overlap or None)
    refuse_circular(found, allow)
    return found


def _sidecar_records(path: Path) -> dict[tuple[str, str], dict[str, Any]]:
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rec = json_loads(line) if line.strip() else None
        except json.JSONDecodeError:
            continue  # read_judged has refused a bad line already, by number
        if isinstance(rec, dict):
            out[(str(rec.get("user_id")), str(rec.get("item_id")))] = rec
    return out


def _judge_by_system(job: EvaluateJob, q: dict, recs, users, config) -> dict[str, Any]:
    side = Path(job.qrels or "") / "imputed.jsonl"
    if not side.is_file():
        return {}
    return judge_by_system(recs, q["logged"], _sidecar_records(side), users, config.k)


def evaluate_text(job: EvaluateJob, res: dict[str, Any]) -> str:
    """``evaluate``'s console report: the estimators first (when there), then the metric
    tables."""
    return "\n".join(evaluation_lines(res, []))


def evaluation_lines(res: dict[str, Any], header: list[str]) -> list[str]:
    """The report's lines: warnings, the estimators (the validated one first), the judge per
    system, then the ranx tables with intervals and paired differences."""
    lines = list(header)
    if res.get("circular"):
        lines += ["", "**CIRCULAR JUDGE (--allow-circular)**: the judge's CF signal is "
                  + "; ".join(f"{n} ({why})" for n, why in res["circular"].items())
                  + ". Its imputed metrics are inflated by construction."]  # fmt: skip
    if res.get("related"):
        lines += [
            "",
            "**RELATED JUDGE**: "
            + "; ".join(f"{n}: {why}" for n, why in res["related"].items())
            + ".",
        ]
    if res.get("few_users"):
        lines += ["", f"**Warning**: {res['few_users']}."]
    lines += verdict_lines(res.get("verdicts") or {})
    lines += tuned_lines(res.get("tuned"))
    if "estimators" in res:
        lines += estimator_lines(res["estimators"])
    if res.get("judge_by_system"):
        lines += judge_lines(res["judge_by_system"])
    return report_lines(res, lines)


def tuned_lines(tuned: dict[str, Any] | None) -> list[str]:
    """The header's line on a judge tuned by ``judge tune``: what its tuning read of the
    evaluated users and of the gold users, and whether an overlap was allowed."""
    if not tuned:
        return []
    gold = tuned.get("gold") or {}
    line = (f"Judge tuned on the team's log (`{tuned.get('model')}`): it read "
            f"{tuned['read_by_tuning']} of the {tuned['evaluated_users']} evaluated users' pasts, "
            f"{tuned['period_overlap']} of them into their held-out period")  # fmt: skip
    if gold:
        line += f"; {gold['read_by_tuning']} of the {gold['gold_users']} gold users"
    overlap = tuned["period_overlap"] or gold.get("read_by_tuning")
    if overlap:
        return ["", f"**TUNED JUDGE OVERLAP (--allow-tuned-overlap)**: {line}. Its imputed "
                "labels and the estimates built on them may be optimistic."]  # fmt: skip
    return ["", f"{line}."]


def judge_lines(by_system: dict[str, Any]) -> list[str]:
    """Per system: the logged hit rate beside the judge's YES rate and mean sigma on the
    unlabelled pairs (a lenient judge shows as YES rates that follow sigma, not the log)."""
    f = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
    lines = ["", "## The judge on each system's lists", "",
             "| system | listed | logged | logged hit rate | judged unlabelled | judge YES rate "
             "| mean sigma |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, d in by_system.items():
        lines.append(f"| {name} | {d['listed']} | {d['logged']} | {f(d['logged_hit_rate'])} | "
                     f"{d['unlabelled_judged']} | {f(d['judge_yes_rate'])} | "
                     f"{f(d['mean_sigma'])} |")  # fmt: skip
    return lines


def _estimator_options(job: EvaluateJob, config: Any) -> tuple[list[str], list[str], list[str]]:
    """(the estimators asked for, the metrics they estimate as ``NAME@K``, the ``--metrics``
    they cannot estimate); ``ndcg_fixed@K`` where none of ``--metrics`` can be.

    Raises:
        ValueError: an unknown estimator (with the closest name), or ``--estimators`` given
            with a metric that has no estimator.
    """
    explicit = bool(job.estimators)
    wanted = [e.strip() for e in (job.estimators or ",".join(ESTIMATORS)).split(",") if e.strip()]
    bad = [e for e in wanted if e not in ESTIMATORS]
    if bad:
        close = suggest(bad[0], list(ESTIMATORS))
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"--estimators: unknown {bad[0]!r}{hint}; use {', '.join(ESTIMATORS)}")
    metrics, skipped = [], []
    for m in config.metrics:
        base, _, cut = m.partition("@")
        if base in RANX_NAMES:
            metrics.append(f"{RANX_NAMES[base]}@{cut or config.k}")
        else:
            skipped.append(m)
    if skipped and explicit:
        raise ValueError(f"--metrics {skipped[0]} has no estimator (they estimate "
                         f"{', '.join(sorted(RANX_NAMES))} @K); drop it from --metrics or drop "
                         "--estimators to get it from ranx alone")  # fmt: skip
    return wanted, metrics or [f"ndcg_fixed@{config.k}"], skipped


def _estimate(job: EvaluateJob, q: dict, recs: list[RecRun], users: list[str], config: Any,
              summary: dict[str, Any]):  # fmt: skip
    """The estimators: the options checked, ``estimate_evaluation``, the lead estimator and
    its validation, the next step (gold pairs to label), and the obp export."""
    wanted, metrics, skipped = _estimator_options(job, config)
    popularity = read_item_popularity(Path(job.qrels or "") / ITEM_POPULARITY)
    props = propensities_from(job.propensities, q["logged"], job.clip, popularity)
    judged = read_judged(Path(job.qrels or "") / "imputed.jsonl")
    calibrated = bool(summary.get("calibrated"))
    gold = None
    if job.gold:
        k = max(int(m.partition("@")[2]) for m in metrics)
        gold = read_gold(job.gold, users, set(listed_pairs(recs, users, k)),
                         [r.name for r in recs], k)  # fmt: skip
        check_redraw(job.gold, gold, recs, users, judged)  # the design's own pi, not edits
        _check_tuned_gold(summary, gold, job.allow_tuned_overlap)
    fitted = refits = refit = None
    if job.calibration:
        if gold is None:
            raise ValueError(f"--calibration {job.calibration} fits the judge to gold labels: "
                             "give --gold FILE (`recjudge gold sample`, labelled)")  # fmt: skip

        rows = read_feature_rows(Path(job.qrels or "") / "imputed.jsonl", popularity)
        fitted = fit_imputer(rows, gold.labels, job.calibration)
        judged = {k: (fitted.p[k], hard) for k, (_, hard) in judged.items() if k in fitted.p}
        calibrated = True

        refits = refit_draws(rows, gold.labels, job.calibration,
                             OUA_DRAWS.get(job.calibration, 1000))  # fmt: skip

        def refit(labels: Any, method: Any = job.calibration) -> dict:
            # the transport check's leave-system-out map: the same imputer on other labels
            return fit_imputer(rows, labels, method, folds=2).p

    got = estimate_evaluation(
        recs, q["logged"], judged, props, users, metrics, wanted,
        calibrated=calibrated, gold=gold, gold_name=Path(job.gold or "").name,
        ppi_intervals=job.ppi_intervals, refits=refits, refit=refit,
        transport_margin=job.transport_margin,
    )  # fmt: skip
    got["skipped_metrics"] = skipped
    if fitted is not None and refits is not None:
        got["calibration"] = (
            f"{fitted.describe()}; dm and dr intervals hold the calibration's own uncertainty: "
            f"each of {len(refits[1])} bootstrap draws resamples the evaluation users and "
            "refits the imputer on resampled gold users (CJE's oracle-uncertainty-aware "
            "bootstrap)")  # fmt: skip
        got["imputer"] = {"method": fitted.method, "features": fitted.features,
                          "folds": fitted.folds, "gold_pairs": fitted.gold_pairs,
                          "gold_users": fitted.gold_users, "out_of_fold": fitted.oof}  # fmt: skip
    if gold is not None:  # for run_evaluate's leniency check; not written anywhere
        got["_gold"] = (gold.labels, {key: hard for key, (_, hard) in judged.items()})
    worse = _imputer_worse(fitted)
    if worse:  # by its own cross-fitted numbers: DM and DR on it may not lead
        got["imputer_worse"] = worse
    got["leads"] = {m: choose_lead(got, wanted, m, calibrated and not worse, job.propensities)
                    for m in metrics}  # fmt: skip
    got["lead"] = got["leads"][metrics[0]]
    got["lead_rule"] = LEAD_RULE
    ctx = Advice(job.runs, job.qrels, config.k, len(gold) if gold is not None else 0)
    got["verdicts"] = verdict_table(got.get("differences") or {}, got["leads"], recs, users,
                                    judged, ctx)  # fmt: skip
    if gold is not None and gold.sequential is not None:
        got["next_step"] = sequential_step(got, metrics[0], *gold.sequential, job.gold,
                                           gold.unit)  # fmt: skip
    else:
        got["next_step"] = _next_step(recs, users, judged, metrics[0], got, job)
    if job.obp_out:
        files = export_obp(recs, q["logged"], judged, props, users, metrics, job.obp_out)
        got["obp_export"] = {"folder": str(job.obp_out), "files": len(files)}
    return got


def _imputer_worse(fitted: Any) -> str | None:
    """The report's line when the fitted imputer ranks the gold pairs worse than the raw
    judge by its own out-of-fold numbers (AUC), else None: a calibration that loses the
    judge's signal must not decide the lead (DM and DR on it)."""
    if fitted is None:
        return None
    a, raw = fitted.oof.get("auc"), fitted.oof.get("auc_raw")
    if a is None or raw is None or a >= raw:
        return None
    return (
        f"the {fitted.method} imputer ranks the gold pairs worse than the raw judge by its "
        f"own cross-fitted numbers (out-of-fold AUC {a:.3f} vs {raw:.3f}): DM and DR on it "
        "do not lead; label more gold pairs, or try --calibration isotonic (p_yes alone)"
    )


#: calibration refits inside dm/dr's bootstrap per method (boosting fits 100 trees a draw)
OUA_DRAWS = {"isotonic": 1000, "logistic": 1000, "boosting": 200}


def _check_tuned_gold(summary: dict[str, Any], gold: Any, allow: bool) -> None:
    """Refuse gold labels of users the judge's tuning read (``tune.gold_overlap``); the outcome goes
    into ``summary['tuned']`` for the report's header."""
    tuned = summary.get("tuned")
    model = (summary.get("judge") or {}).get("model")
    if not tuned or not model:
        return
    if not Path(str(model)).is_dir():
        if allow:
            return
        raise TunedLeakageError(
            f"the judge was tuned (`judge tune`), but its folder {model} is not here, so the "
            "gold users cannot be checked against its tuning; run evaluate where the folder is, "
            "or pass --allow-tuned-overlap"
        )
    found = gold_overlap(model, {u for u, _ in gold.labels})
    refuse_gold(found, model, allow)
    tuned["gold"] = found


#: the sequential gold file's target: every system's PPI half-width within this share of
#: its value (or ``SEQUENTIAL_FLOOR``), as the fixed design's next step aims for
SEQUENTIAL_TARGET = 0.10
SEQUENTIAL_FLOOR = 1e-3
#: the fewest labelled users (pairs) a sequential file may stop at: a width-based stop is
#: valid as the width shrinks (Chow and Robbins 1965), and at a handful of clusters the width
#: itself is too noisy to stop on (users: twice the design's smallest interval,
#: MIN_USER_CLUSTERS; pairs: each mostly a user of its own)
MIN_SEQUENTIAL = {"users": 10, "pairs": 50}


def sequential_stop(
    intervals: Mapping[str, tuple[float, float, float] | None],
    m: int,
    total: int,
    unit: str = "users",
) -> dict[str, Any]:
    """Whether a sequentially labelled gold file may stop, after ``m`` of its ``total``
    users (or pairs, ``unit``): the fixed-width stopping rule of Chow and Robbins ("On the
    asymptotic theory of fixed-width sequential confidence intervals for the mean", Ann.
    Math. Statist. 36, 1965) on each system's PPI interval ``(value, lo, hi)`` (None: refused
    at this size): stop once every half-width ``h`` is at most ``max(0.1 |value|, 1e-3)`` and at
    least ``MIN_SEQUENTIAL[unit]`` are labelled; else go on to about ``ceil(m (h /
    target)^2)`` (the width shrinks as ``1 / sqrt(m)``). The labelled units are a random
    prefix of the file's order, whatever the stop, so the interval at the stop is the
    design's at that ``m`` (its coverage at the stop: the tests' simulations).

    Returns:
        ``{"stop", "users" (labelled, in ``unit``), "of" (total), "target_users", "unit",
        "widest"}``; ``target_users`` above ``total``: the target is out of reach here.
    """
    need, widest = max(m, MIN_SEQUENTIAL[unit]), None
    for name, iv in intervals.items():
        if iv is None:  # no valid interval yet: at least one more user, and the minimum
            need = max(need, m + 1)
            continue
        value, lo, hi = iv
        half, goal = (hi - lo) / 2, max(SEQUENTIAL_TARGET * abs(value), SEQUENTIAL_FLOOR)
        need = max(need, int(np.ceil(m * (half / goal) ** 2 - 1e-9)))
        if widest is None or half / goal > widest[1]:
            widest = (name, half / goal)
    return {"stop": need <= m, "users": m, "of": total, "target_users": need, "unit": unit,
            "widest": widest[0] if widest else None}  # fmt: skip


def sequential_step(got: dict[str, Any], metric: str, m: int, total: int,
                    gold: str | None, unit: str = "users") -> dict[str, Any]:  # fmt: skip
    """``evaluate``'s next step with a sequential gold file: stop labelling, or how many
    users to label next (``sequential_stop`` on each system's PPI interval of ``metric``)."""
    intervals = {}
    for name, by_metric in got["systems"].items():
        e = (by_metric.get(metric) or {}).get("ppi") or {}
        ci = e.get("ci")
        intervals[name] = None if ci is None or e.get("value") is None else (
            e["value"], ci[0], ci[1])  # fmt: skip
    s = sequential_stop(intervals, m, total, unit)
    head = f"sequential gold, {m} of {total} {unit} labelled"
    if s["stop"]:
        text = (f"{head}: stop labelling; every system's PPI interval of {metric} is within "
                f"+-{SEQUENTIAL_TARGET:.0%} of its value")  # fmt: skip
    elif m >= total:
        text = (f"{head}: every one is labelled, so this is the narrowest interval this "
                "evaluation allows; impute more users (--users) and draw again for a "
                "narrower one")  # fmt: skip
    elif s["target_users"] > total:
        text = (f"{head}: +-{SEQUENTIAL_TARGET:.0%} needs about {s['target_users']} {unit}, "
                f"more than the file's {total}: label them all for the narrowest interval "
                "this evaluation allows, or impute more users (--users) and draw "
                "again")  # fmt: skip
    else:
        whole = "whole users" if unit == "users" else "pairs"
        text = (f"{head}: go on to order {s['target_users']} ({whole}, from the top of "
                f"{gold}), then evaluate again"
                + (f"; {s['widest']}'s interval is the widest" if s["widest"] else "; some "
                   "system has no valid interval yet"))  # fmt: skip
    return {**s, "sequential": True, "text": text}


def _next_step(recs, users, judged, metric, got, job) -> dict[str, Any] | None:
    """How many gold pairs to label for a +-10 % interval on the lead estimate: the users'
    metric spread under the judge's probabilities (``judge_spread``), ``gold_units_needed``
    users, times the mean listed pairs per user (the ``users`` design labels all of them)."""
    base, k = parse_metric(metric)
    if base not in ("precision", "dcg", "ndcg_fixed") or len(users) < 2:
        return None
    need = 0
    for run in recs:
        mean, sd = judge_spread([(1.0, run)], users, judged, metric)
        lead = got["systems"][run.name][metric].get(got["lead"]["estimator"]) or {}
        target = 0.1 * abs(lead.get("value") or mean)
        need = max(need, gold_units_needed(sd, max(target, 1e-3)) or 0)
    if not need:
        return None
    everyone = len(listed_pairs(recs, users, k))
    have = got.get("gold", "none") != "none"
    if need > len(users):  # more users than were evaluated: the target is out of reach here
        return {"users": len(users), "pairs": everyone, "have_gold": have, "unreachable": (
            f"a +-10 % interval needs about {need} users' gold labels, more than the "
            f"{len(users)} evaluated: labelling all {everyone} listed pairs gives the widest "
            "this evaluation allows; impute more users (--users) for a narrower one"),
            "command": f"recjudge gold sample --runs {job.runs} --qrels {job.qrels} --k {k} "
                       f"--n {everyone} --out gold.csv"}  # fmt: skip
    pairs = int(np.ceil(need * everyone / len(users)))
    return {"users": need, "pairs": pairs, "have_gold": have,
            "command": f"recjudge gold sample --runs {job.runs} --qrels {job.qrels} --k {k} "
                       f"--n {pairs} --out gold.csv"}  # fmt: skip


def _next_step_lines(step: dict[str, Any] | None) -> list[str]:
    """The report's next-step line: how many gold pairs to label, or, with a sequential gold
    file, whether to stop."""
    if not step:
        return []
    if step.get("sequential"):
        return [f"- next step: {step['text']}"]
    if step.get("unreachable"):
        return [f"- next step: {step['unreachable']} (`{step['command']}`)"]
    return [f"- next step: for a +-10 % interval label about {step['pairs']} pairs "
            f"({step['users']} users' lists, the gold alone; PPI needs fewer the better the "
            f"judge agrees): `{step['command']}`, then evaluate with --gold gold.csv"]  # fmt: skip


def estimator_lines(est: dict) -> list[str]:
    """The estimator tables: the lead estimator first (with its validation), then per
    system and metric each estimator with its 95 % user bootstrap interval and the share of
    the metric the judge decides; ``imputed`` labelled as the BRIEF paper's biased protocol."""
    lead = est.get("lead") or {}
    lines = ["", "## Estimators", ""]
    if lead:
        lines += [f"**Lead estimator: {lead['estimator']}** ({lead['metric']}): "
                  f"{lead.get('why', '')}. The rule: {est.get('lead_rule', LEAD_RULE)}.",
                  ""]  # fmt: skip
    fit = est.get("propensity_fit")
    lines += [f"- propensities: {est['propensity']} ({est['clipped']} lookups clipped; share "
              "of inverse-propensity weight on clipped pairs: " + ", ".join(
                  f"{n} {v:.1%}" for n, v in (est.get("clipped_weight_share") or {}).items())
              + ")"]  # fmt: skip
    if fit:
        lines.append("- propensity fit per training-popularity quintile (observed vs predicted "
                     "observation rate): " + "; ".join(
                         f"{q['popularity'][0]}-{q['popularity'][1]}: {q['observed_rate']:.4f} "
                         f"vs {q['predicted_rate']:.4f}" for q in fit["quintiles"]))  # fmt: skip
    for name, d in (est.get("weights") or {}).items():
        top = "n/a" if d["top1_share"] is None else f"{d['top1_share']:.0%}"
        lines.append(
            f"- inverse-propensity weights, {name}: **{d['verdict']}**: effective sample size "
            f"{d['ess']:.1f} of {d['logged_pairs']} logged pairs, top 1 % of weights carry {top} "
            f"of its IPS estimate"
            + (f" (fragile: ESS < {MIN_ESS} or top 1 % > {FRAGILE_TOP_SHARE:.0%}; IPS, SNIPS "
               "and DR cannot lead)" if d["verdict"] == "fragile" else "")
        )  # fmt: skip
    lines += [f"- calibration: {est['calibration']}", f"- gold sample: {est['gold']}"]
    if est.get("imputer_worse"):
        lines.append(f"- **imputer worse than the judge**: {est['imputer_worse']}")
    lines += [transport_line(name, d) for name, d in (est.get("transport") or {}).items()]
    if est.get("skipped_metrics"):
        lines.append(f"- no estimator for {', '.join(est['skipped_metrics'])} (ranx only, "
                     "below)")  # fmt: skip
    lines += _next_step_lines(est.get("next_step"))
    order = [lead.get("estimator")] if lead else []
    lines += ["", "| system | metric | estimator | value [95 % CI] | rank [95 % CI] | "
              "judge share | note |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for system, by_metric in est["systems"].items():
        for metric, by_est in by_metric.items():
            names = [n for n in order if n in by_est] + [n for n in by_est if n not in order]
            for name in names:
                e = by_est[name]
                if e["value"] is None:
                    shown = "undefined"
                else:
                    shown = interval(e["value"], *(e["ci"] or (None, None)), nd=4)
                label = "imputed (BRIEF protocol, biased)" if name == "imputed" else name
                if name == lead.get("estimator"):
                    label = f"**{name}** (lead)"
                rank = (f"{e['rank']} [{e['rank_ci'][0]}, {e['rank_ci'][1]}]"
                        if e.get("rank_ci") else "n/a")  # fmt: skip
                lines.append(f"| {system} | {metric} | {label} | {shown} | {rank} | "
                             f"{e['judge_share']:.2f} | {e['note']} |")  # fmt: skip
    return lines + worth_lines(est.get("judge_worth") or {})


def transport_line(name: str, d: dict[str, Any]) -> str:
    """The report's line on one system's transport check (``_transport``: pass, fail or
    inconclusive against the margin)."""
    if d.get("mean_residual") is None:
        return (f"- transport check, {name}: inconclusive ("
                + (d.get("why") or f"{d['users']} users hold its gold pairs; "
                   f"{MIN_TRANSPORT_USERS} needed") + ")")  # fmt: skip
    lo, hi = d["ci"]
    how = ", map fitted without its pairs" if d.get("map") == "leave-system-out" else ""
    margin = d.get("margin", TRANSPORT_MARGIN)
    head = (f"- transport check, {name}{how}: **{d['verdict']}** (margin +-{margin:g}): "
            f"calibration's mean residual {d['mean_residual']:+.3f} [{lo:+.3f}, {hi:+.3f}] on "
            f"{d['gold_pairs']} gold pairs of {d['users']} users (p = {d['p']:.3g})")  # fmt: skip
    if d["verdict"] == "fail":
        return head + "; its calibrated level (dm, dr) is refused"
    if d["verdict"] == "pass":
        lo90, hi90 = d.get("ci_equivalence") or (lo, hi)
        return head + f"; its 90 % interval [{lo90:+.3f}, {hi90:+.3f}] lies within the margin"
    why = (f"fewer than {MIN_PASS_USERS} labelled users to pass" if d["users"] < MIN_PASS_USERS
           else "its 90 % interval reaches past the margin")  # fmt: skip
    if d.get("detectable") is not None:
        why += (f"; this sample detects a residual of {d['detectable']:.3f} or more at "
                f"{POWER:.0%} power, not a smaller one")  # fmt: skip
    return f"{head}: transport not shown ({why})"


def write_evaluation(res: dict[str, Any], recs: Sequence[RecRun], job: EvaluateJob, out: str):
    """``evaluate``'s report folder: report.md, results.json (with the job, so ``recjudge run
    evaluate --config results.json`` reruns it), evaluate.png."""
    source, note = job.qrels or job.feedback or "", job.note
    header = [
        "# Offline evaluation: estimators, logged-only and imputed feedback",
        "",
        f"Systems: {', '.join(f'{r.name} ({r.path})' for r in recs)}. Qrels: {source}.",
        *(["", note] if note else []),
    ]
    lines = evaluation_lines(res, header)
    runs = {r.name: r.path for r in recs}
    Path(out).mkdir(parents=True, exist_ok=True)
    plot_scores(res, Path(out) / "evaluate.png")  # first: report.html embeds it
    write_report(out, {**res, "runs": runs, "job": job.model_dump(mode="json")}, lines)


def run_augment(job: AugmentJob, progress: bool = True, warn: Warn | None = None) -> dict:
    """Add the judge's top-M YES candidates per user as pseudo-positives; the augmented
    dataset goes to ``job.out`` (``cf train`` reads it), the judge's store beside it."""
    warn = warn or warnings.warn
    data = load_dataset(job.data)
    run = restrict_to(read_run(job.candidates, job.run_format), data)
    _warn_checks([run], warn)
    judge, store = _judge_and_store(data, job, Path(f"{job.out}.judge"))
    source = sigma_source(job.cf, JudgeConfig(mode=job.mode).uses_cf(), data.name)
    with store:
        s = augment(judge, data, run, _sub(job, AugmentConfig), job.out, store=store,
                    progress=progress)  # fmt: skip
    s["warnings"] = _augment_warnings(s, circular_systems(source, [run]))
    for line in s["warnings"]:
        warn(line)
    return s


#: a YES rate at or above this on at least ``ALL_YES_MIN`` candidates: the judge did not
#: discriminate, and the pseudo-positives are the candidate list itself
ALL_YES, ALL_YES_MIN = 0.99, 10


def _augment_warnings(s: dict[str, Any], circular: dict[str, str]) -> list[str]:
    """What a team must know before retraining on the augmented data: a judge whose CF
    signal wrote the candidates, and a judge that said YES to (nearly) everything."""
    out = [f"the judge's CF signal is the model that wrote the candidates ({why}): it says YES "
           "to what that model ranks high, so the augmented data feeds the model its own picks"
           for why in circular.values()]  # fmt: skip
    judged = s["candidates"] - s["failed"]
    if judged >= ALL_YES_MIN and s["yes"] >= ALL_YES * judged:
        out.append(f"the judge said YES to {s['yes']} of {judged} candidates: it does not "
                   "discriminate here, and the pseudo-positives are the candidate list itself "
                   "(check the judge on gold labels, or a sigma source independent of the "
                   "candidates)")  # fmt: skip
    return out


def augment_text(job: AugmentJob, s: dict[str, Any]) -> str:
    """``augment``'s console summary: counts and how many users got how many pseudo-positives
    (``3 users got 2``); its warnings went to stderr as the run ended."""
    per = s["seconds_per_judged_pair"]
    dist = sorted(((int(n), c) for n, c in s["added_per_user"].items()), reverse=True)
    spread = ", ".join(f"{c} user{'s' if c != 1 else ''} got {n}" for n, c in dist)
    return (f"{s['users']} users, {s['candidates']} candidates: {s['yes']} YES, {s['added']} "
            f"pseudo-positives added ({spread}), {s['failed']} failed"
            f"{f', {per} s per judged pair' if per else ''} -> {job.out}")  # fmt: skip


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
    #: the command's words (``("gold", "sample")`` is ``recjudge gold sample``); () = (name,)
    command: tuple[str, ...] = ()
    #: whether ``cli._jobs`` makes the command; False where the group's own module makes it
    #: (``judge tune``: ``cli._judge``, so ``recjudge judge`` never imports this package)
    cli_jobs: bool = True


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
    "gold-sample",
    JobSpec(
        GoldSampleJob,
        run_gold_sample,
        gold_text,
        "Draw pairs for a person to label from the evaluated lists (the design is recorded).",
        ("gold", "sample"),
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
JOBS.register(
    "judge",
    JobSpec(
        JudgeJob,
        run_judge,
        judge_text,
        JUDGE_SUMMARY,
        ("judge",),
        cli_jobs=False,  # the `judge` group's own command (its subcommand is `tune`)
    ),
)
JOBS.register(
    "judge-tune",
    JobSpec(
        TuneJob,
        run_tune,
        tune_text,
        "Tune the judge's model on your log (LoRA, merged into a folder every backend loads).",
        ("judge", "tune"),
        cli_jobs=False,
    ),
)
