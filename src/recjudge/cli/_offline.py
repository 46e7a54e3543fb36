"""``recjudge impute / evaluate / augment``: the judge on your data and your recommenders."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from pydantic import ValidationError

from recjudge._registry import UnknownNameError
from recjudge.cli._app import app, emit, fail, option_errors
from recjudge.reporting import interval

RUNS_HELP = (
    "Comma-separated run files (TREC, ranx JSON, JSONL/Parquet with user_id,item_id,score "
    "or rank), each optionally NAME=PATH."
)


class _JudgeOptions:
    """The judge flags shared by impute and augment (typer options, in one place)."""

    model = typer.Option("qwen2.5-coder-0.5b", "--model", help="Judge LLM (preset, path or id).")
    cf = typer.Option(None, "--cf", help="A saved CF model folder (sigma source).")
    mode = typer.Option(
        "brief", "--mode", help="brief, non-adaptive, no-behavior, zero-shot, pub, agent4rec..."
    )
    beta = typer.Option(25.0, "--beta")
    no_evidence = typer.Option(
        False, "--no-evidence", help="Stop at the decision step (labels only, faster)."
    )
    batch_size = typer.Option(8, "--batch-size")
    max_history = typer.Option(50, "--max-history", min=1)
    allow_cf_mismatch = typer.Option(False, "--allow-cf-mismatch")
    resume = typer.Option(
        False, "--resume", help="Continue OUT/store.sqlite (reuses finished pairs)."
    )
    device = typer.Option(
        "auto", "--device", help="In process: auto (CUDA when available), cpu, cuda or cuda:N."
    )


def _parse_runs(spec: str, fmt: str):
    from recjudge.evaluators import read_run

    runs = []
    for part in [p.strip() for p in spec.split(",") if p.strip()]:
        name, _, path = part.rpartition("=") if "=" in part else ("", "", part)
        runs.append(read_run(path, fmt, name or None))
    if not runs:
        fail("--runs names no file")
    return runs


def _judge_and_store(data_ds, opts: dict, out: Path):
    from recjudge.cf_models import check_fits
    from recjudge.cli._judge import build_judge
    from recjudge.reward import ResultsStore

    judge = build_judge(
        opts["model"], opts["mode"], opts["cf"], opts["beta"], not opts["no_evidence"],
        batch_size=opts["batch_size"], max_history=opts["max_history"], dataset=data_ds,
        device=opts.get("device", "auto"),
    )  # fmt: skip
    if judge.cf is not None:
        check_fits(judge.cf, data_ds, allow_mismatch=opts["allow_cf_mismatch"])
    store_path = out / "store.sqlite"
    if store_path.exists() and not opts["resume"]:
        fail(f"{store_path} exists; pass --resume to continue it, or choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    return judge, ResultsStore(store_path)


def _warn_checks(runs) -> None:
    for r in runs:
        problems = r.check.problems()
        if problems:
            typer.echo(f"{r.path}: {problems} (rules: recjudge.evaluators._runs)", err=True)


@app.command("impute")
def impute_cmd(
    data: str = typer.Option(..., "--data", help="What the recommenders trained on (histories)."),
    feedback: str = typer.Option(
        ..., "--feedback", help="Held-out logged feedback: a dataset name or folder."
    ),
    runs: str = typer.Option(..., "--runs", help=RUNS_HELP),
    out: str = typer.Option(..., "--out", help="Folder for qrels, imputed.jsonl, summary."),
    k: int = typer.Option(20, "--k", min=1, help="Judge each ranking's top-k."),
    users: int = typer.Option(None, "--users", min=1, help="A seeded sample of users."),
    seed: int = typer.Option(0, "--seed"),
    min_rating: float = typer.Option(
        None, "--min-rating", help="Logged relevance: rating >= this (default: positive events)."
    ),
    run_format: str = typer.Option(
        "auto", "--run-format", help="auto, trec, ranx, jsonl, parquet."
    ),
    model: str = _JudgeOptions.model,
    cf: str = _JudgeOptions.cf,
    mode: str = _JudgeOptions.mode,
    beta: float = _JudgeOptions.beta,
    no_evidence: bool = _JudgeOptions.no_evidence,
    batch_size: int = _JudgeOptions.batch_size,
    max_history: int = _JudgeOptions.max_history,
    allow_cf_mismatch: bool = _JudgeOptions.allow_cf_mismatch,
    resume: bool = _JudgeOptions.resume,
    device: str = _JudgeOptions.device,
    calibration: str = typer.Option(
        None,
        "--calibration",
        help="A map from `recjudge calibrate` (made for this judge): adds p_calibrated.",
    ),
    judge_logged: bool = typer.Option(
        False,
        "--judge-logged",
        help="Also judge the logged top-k pairs (their logged labels stay in the qrels): "
        "evaluate --estimators dm,dr need the judge's probability for every listed pair.",
    ),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Label every unlabelled (user, item) in the runs' top-k with the judge; write qrels."""
    from recjudge.data import load_dataset
    from recjudge.evaluators import ImputeConfig, impute, restrict_to

    opts = dict(locals())
    try:
        config = ImputeConfig(
            k=k, users=users, seed=seed, min_rating=min_rating, judge_logged=judge_logged
        )
        data_ds, fb = load_dataset(data), load_dataset(feedback)
        recs = [restrict_to(r, data_ds, k) for r in _parse_runs(runs, run_format)]
        _warn_checks(recs)
        judge, store = _judge_and_store(data_ds, opts, Path(out))
        cmap = None
        if calibration:
            from recjudge.evaluators._calibrate import load_map

            cmap = load_map(calibration, judge.config.model_dump(mode="json"))
        with store:
            s = impute(judge, data_ds, fb, recs, config, out, store=store, progress=True,
                       calibration=cmap)  # fmt: skip
    except (UnknownNameError, KeyError, ValueError, FileNotFoundError, ConnectionError) as e:
        fail(str(e).strip("'\""))
    if as_json:
        emit(s)
        return
    per = s["seconds_per_judged_pair"]
    imp = s["reused_from_checkpoint"]
    typer.echo(
        f"{s['users']} users, {s['pairs']} unlabelled pairs: {s['imputed_yes']} YES, "
        f"{s['imputed_no']} NO, {s['failed']} failed, {s['reused']} from the store"
        f"{f' ({imp} of them from an imported checkpoint)' if imp else ''}"
        f"{f', {per} s per judged pair' if per else ''} -> {out}/qrels_imputed.trec"
    )


@app.command("evaluate")
def evaluate_cmd(
    runs: str = typer.Option(..., "--runs", help=RUNS_HELP),
    qrels: str = typer.Option(
        None, "--qrels", help="An `impute` --out folder: logged and imputed qrels side by side."
    ),
    feedback: str = typer.Option(
        None, "--feedback", help="Without --qrels: held-out logged feedback (dataset)."
    ),
    metrics: str = typer.Option("ndcg@10,precision@10,recall@10,mrr@10", "--metrics"),
    k: int = typer.Option(20, "--k", min=1),
    min_rating: float = typer.Option(None, "--min-rating"),
    stat_test: str = typer.Option(
        "student", "--stat-test", help="student (paired t-test), fisher (randomisation), tukey."
    ),
    run_format: str = typer.Option("auto", "--run-format"),
    out: str = typer.Option(None, "--out", help="Report folder (report.md, results.json, PNG)."),
    estimators: str = typer.Option(
        None,
        "--estimators",
        help="Also estimate with logged,imputed,dm,ips,snips,dr (needs --qrels; dm/dr need "
        "impute --judge-logged). Metrics precision/dcg/ndcg@K (all), hit/mrr@K (logged, "
        "imputed, dm).",
    ),
    propensities: str = typer.Option(
        "powerlaw:0.5",
        "--propensities",
        help="Observation propensities: a file (item_id,propensity or user_id,item_id,"
        "propensity) or powerlaw:EXP (Yang et al. 2018, from the logged labels' item counts).",
    ),
    clip: float = typer.Option(0.01, "--clip", min=1e-6, max=1.0, help="Propensity floor."),
    gold: str = typer.Option(
        None,
        "--gold",
        help="Gold pairs (user_id,item_id,label) drawn uniformly from the listed pairs: adds "
        "a prediction-powered (PPI++) estimate with an interval valid whatever the judge's bias.",
    ),
    obp_out: str = typer.Option(
        None,
        "--obp-out",
        help="With --estimators: also write each run's lists as Open Bandit Pipeline inputs "
        "(one .npz per run and linear metric + index.json) for obp's DM/IPS/SNIPS/DR.",
    ),
    note: str = typer.Option(
        None, "--note", help="A paragraph for the report's header (protocol, deviations)."
    ),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Metrics per system on logged-only and on imputed feedback, paired tests, and how far
    the two agree on the systems' order."""
    from recjudge.evaluators import (
        QRELS_KINDS,
        EvaluateConfig,
        evaluate_runs,
        evaluation_users,
        logged_qrels,
        read_qrels,
    )

    try:
        config = EvaluateConfig(metrics=tuple(m.strip() for m in metrics.split(",") if m.strip()),
                                k=k, stat_test=stat_test)  # fmt: skip
        recs = _parse_runs(runs, run_format)
        if qrels:
            if not (Path(qrels) / "qrels_imputed.json").exists():
                fail(f"{qrels} holds no qrels_logged.json / qrels_imputed.json; --qrels takes "
                     "the --out folder of `recjudge impute`")  # fmt: skip
            q = {kind: read_qrels(Path(qrels) / f"qrels_{kind}.json")
                 for kind in QRELS_KINDS}  # fmt: skip
            users = sorted(q["imputed"])
        elif feedback:
            from recjudge.data import load_dataset

            q = {"logged": logged_qrels(load_dataset(feedback), min_rating)}
            users = evaluation_users(recs, q["logged"])
        else:
            fail("give --qrels DIR (from `recjudge impute`) or --feedback DATA")
        res = evaluate_runs(q, recs, users, config)
        if estimators:
            res["estimators"] = _estimate(estimators, propensities, clip, qrels, q, recs,
                                          users, config, gold, obp_out)  # fmt: skip
        elif gold or obp_out:
            flag = "--gold" if gold else "--obp-out"
            raise ValueError(f"{flag} goes with --estimators (e.g. --estimators dm,dr)")
    except ValidationError as e:
        fail(option_errors(e))
    except (UnknownNameError, KeyError, ValueError, FileNotFoundError) as e:
        fail(str(e).strip("'\""))
    if out:
        _write_evaluation(res, recs, qrels or feedback, out, note)
    if as_json:
        emit(res)
        return
    from recjudge.evaluators._evaluate import report_lines

    typer.echo("\n".join(report_lines(res, [])))
    if "estimators" in res:
        typer.echo("\n".join(estimator_lines(res["estimators"])))


def _estimate(names, propensities, clip, qrels_dir, q, recs, users, config, gold=None,
              obp_out=None):  # fmt: skip
    """``evaluate --estimators``: the options checked, then ``estimate_evaluation`` (and the
    obp export)."""
    from recjudge.evaluators._estimators import (
        ESTIMATORS,
        RANX_NAMES,
        estimate_evaluation,
        export_obp,
        propensities_from,
        read_gold,
        read_judged,
    )

    wanted = [e.strip() for e in names.split(",") if e.strip()]
    bad = [e for e in wanted if e not in ESTIMATORS]
    if bad:
        from recjudge._registry import suggest

        close = suggest(bad[0], list(ESTIMATORS))
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"--estimators: unknown {bad[0]!r}{hint}; use {', '.join(ESTIMATORS)}")
    if not qrels_dir:
        raise ValueError("--estimators needs --qrels DIR (an impute --out folder: its "
                         "imputed.jsonl holds the judge's probabilities)")  # fmt: skip
    props = propensities_from(propensities, q["logged"], clip)
    judged = read_judged(Path(qrels_dir) / "imputed.jsonl")
    metrics = [
        f"{RANX_NAMES[base]}@{cut or config.k}"
        for base, _, cut in (m.partition("@") for m in config.metrics)
        if base in RANX_NAMES
    ] or [f"ndcg@{config.k}"]
    summary = Path(qrels_dir) / "summary.json"
    calibrated = bool(summary.exists() and json.loads(summary.read_text()).get("calibrated"))
    pairs = None
    if gold:
        k = max(int(m.partition("@")[2]) for m in metrics)
        listed = {(u, i) for r in recs for u in users for i in r.rankings.get(u, [])[:k]}
        pairs = read_gold(gold, users, listed)
    got = estimate_evaluation(
        recs, q["logged"], judged, props, users, metrics, wanted,
        calibrated=calibrated, gold=pairs, gold_name=Path(gold or "").name,
    )  # fmt: skip
    if obp_out:
        files = export_obp(recs, q["logged"], judged, props, users, metrics, obp_out)
        got["obp_export"] = {"folder": str(obp_out), "files": len(files)}
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


def _write_evaluation(res, recs, source: str, out: str, note: str | None = None) -> None:
    from recjudge.evaluators._evaluate import plot_scores, report_lines
    from recjudge.reporting import write_report

    header = [
        "# Offline evaluation: logged-only vs imputed feedback",
        "",
        f"Systems: {', '.join(f'{r.name} ({r.path})' for r in recs)}. Qrels: {source}.",
        *(["", note] if note else []),
    ]
    lines = report_lines(res, header)
    if "estimators" in res:
        lines += estimator_lines(res["estimators"])
    write_report(out, {**res, "runs": {r.name: r.path for r in recs}}, lines)
    plot_scores(res, Path(out) / "evaluate.png")


@app.command("calibrate")
def calibrate_cmd(
    judgments: str = typer.Option(
        ..., "--judgments", help="An impute --out folder (imputed.jsonl and summary.json)."
    ),
    labels: str = typer.Option(
        ..., "--labels", help="Labelled pairs: CSV/JSONL with user_id, item_id, label (0/1)."
    ),
    out: str = typer.Option(..., "--out", help="Folder: calibration.json, report.md, PNG."),
    folds: int = typer.Option(5, "--folds", min=2, help="Folds of the cross-fitted check."),
    seed: int = typer.Option(0, "--seed"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """The judge against labels you trust: AUC, Brier, ECE, kappa, a reliability diagram,
    and an isotonic map (p_yes -> P(relevant)) that impute --calibration applies."""
    from recjudge._util import atomic_write_json
    from recjudge.data import DataError
    from recjudge.evaluators._calibrate import (
        calibrate,
        judge_settings,
        plot_reliability,
        read_labels,
    )
    from recjudge.evaluators._estimators import read_judged
    from recjudge.reporting import write_report

    try:
        folder = Path(judgments)
        summary_path = folder / "summary.json"
        if not summary_path.exists():
            raise DataError("no summary.json here.", source=str(folder),
                            fix="pass the --out folder of `recjudge impute`")  # fmt: skip
        judge = judge_settings(json.loads(summary_path.read_text()))
        res = calibrate(read_judged(folder / "imputed.jsonl", raw=True), read_labels(labels),
                        judge, folds=folds, seed=seed)  # fmt: skip
    except (DataError, ValueError) as e:
        fail(str(e))
    outp = Path(out)
    atomic_write_json(outp / "calibration.json", res)
    plot_reliability(res, outp / "reliability.png")
    write_report(outp, res, calibration_lines(res))
    if as_json:
        emit({k: v for k, v in res.items() if k not in ("map",)})
        return
    typer.echo("\n".join(calibration_lines(res)))


@app.command("audit")
def audit_cmd(
    judgments: str = typer.Option(
        None, "--judgments", help="An impute --out folder (imputed.jsonl and summary.json)."
    ),
    data: str = typer.Option(None, "--data", help="The dataset the judge read (histories)."),
    arena: str = typer.Option(
        None,
        "--arena",
        help="Instead: a RecSys Arena run folder (verdicts.jsonl): verdicts by list position "
        "per aspect, order-flip rates, and each system's wins in A and in B.",
    ),
    out: str = typer.Option(..., "--out", help="Folder: report.md, results.json, audit.png."),
    labels: str = typer.Option(
        None, "--labels", help="Optional labelled pairs (user_id,item_id,label) for the gaps."
    ),
    bins: int = typer.Option(10, "--bins", min=2, max=50, help="Quantile bins per factor."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Bias audit of a judgments file: YES rate and calibration by item popularity,
    history length and title length (table + PNG); or of an arena run: verdicts by list
    position."""
    from recjudge.data import DataError, load_dataset
    from recjudge.evaluators._audit import audit, audit_factors, audit_lines, plot_audit
    from recjudge.evaluators._calibrate import read_labels
    from recjudge.evaluators._estimators import read_judged
    from recjudge.reporting import write_report

    if arena:
        if judgments or labels:
            fail("--arena audits an arena run on its own: drop --judgments/--labels")
        _arena_audit(arena, out, as_json)
        return
    if not (judgments and data):
        fail("give --judgments DIR and --data DATA (an impute run), or --arena DIR")
    try:
        judged = read_judged(Path(judgments) / "imputed.jsonl", raw=True)
        if not judged:
            raise DataError(
                "no judged pair in it.",
                source=str(Path(judgments) / "imputed.jsonl"),
                fix="pass the --out folder of a finished `recjudge impute`",
            )
        pairs = sorted(judged)
        gold = read_labels(labels) if labels else None
        res = audit(
            pairs,
            [judged[k][0] for k in pairs],
            [judged[k][1] for k in pairs],
            audit_factors(load_dataset(data), pairs),
            [gold.get(k) for k in pairs] if gold is not None else None,
            bins=bins,
        )
    except (DataError, ValueError, KeyError) as e:
        fail(str(e).strip("'\""))
    header = ["# Judge bias audit", "",
              f"{len(pairs)} judged pairs from {judgments}; dataset {data}; "
              f"{'labels: ' + labels if labels else 'no labels (YES rates only)'}."]  # fmt: skip
    write_report(out, {"factors": res, "pairs": len(pairs)}, audit_lines(res, header))
    plot_audit(res, Path(out) / "audit.png")
    if as_json:
        emit({"pairs": len(pairs), "factors": res})
        return
    typer.echo("\n".join(audit_lines(res, header)))


def calibration_lines(res: dict) -> list[str]:
    """The calibration report."""
    cf = res["cross_fitted"]
    kappa = "undefined" if res["kappa"] is None else f"{res['kappa']:.3f}"
    return [
        "# Judge calibration against labels",
        "",
        f"Judge: {res['judge']}. {res['pairs']} labelled pairs among the judged ones "
        f"({res['unmatched_labels']} labels matched no judged pair).",
        "",
        f"- base rate of relevant labels {res['base_rate']:.3f}; judge YES rate "
        f"{res['judge_yes_rate']:.3f}",
        f"- AUC of p_yes {res['auc']:.3f}; Cohen's kappa of the hard labels {kappa}",
        f"- raw p_yes: Brier {res['brier']:.4f}, ECE {res['ece']:.4f}",
        f"- isotonic map, cross-fitted over {cf['folds']} folds: Brier {cf['brier']:.4f}, "
        f"ECE {cf['ece']:.4f}",
        "",
        "The map (fit on every pair) is calibration.json: `recjudge impute --calibration "
        "calibration.json` writes p_calibrated, which `evaluate --estimators` uses.",
        "",
        "![reliability](reliability.png)",
    ]


@app.command("augment")
def augment_cmd(
    data: str = typer.Option(..., "--data", help="The training data to augment."),
    candidates: str = typer.Option(..., "--candidates", help="A run file: candidates per user."),
    out: str = typer.Option(..., "--out", help="The augmented dataset folder."),
    k: int = typer.Option(10, "--k", min=1, help="Candidates judged per user."),
    top_m: int = typer.Option(2, "--top-m", min=1, help="Most pseudo-positives added per user."),
    users: int = typer.Option(None, "--users", min=1),
    seed: int = typer.Option(0, "--seed"),
    run_format: str = typer.Option("auto", "--run-format"),
    model: str = _JudgeOptions.model,
    cf: str = _JudgeOptions.cf,
    mode: str = _JudgeOptions.mode,
    beta: float = _JudgeOptions.beta,
    no_evidence: bool = _JudgeOptions.no_evidence,
    batch_size: int = _JudgeOptions.batch_size,
    max_history: int = _JudgeOptions.max_history,
    allow_cf_mismatch: bool = _JudgeOptions.allow_cf_mismatch,
    resume: bool = _JudgeOptions.resume,
    device: str = _JudgeOptions.device,
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Add the judge's top-M YES candidates per user as pseudo-positives (`cf train` reads it)."""
    from recjudge.data import load_dataset
    from recjudge.evaluators import AugmentConfig, augment, read_run, restrict_to

    opts = dict(locals())
    try:
        config = AugmentConfig(k=k, top_m=top_m, users=users, seed=seed)
        data_ds = load_dataset(data)
        run = restrict_to(read_run(candidates, run_format), data_ds)
        _warn_checks([run])
        store_dir = Path(f"{out}.judge")
        judge, store = _judge_and_store(data_ds, opts, store_dir)
        with store:
            s = augment(judge, data_ds, run, config, out, store=store, progress=True)
    except (UnknownNameError, KeyError, ValueError, FileNotFoundError, ConnectionError) as e:
        fail(str(e).strip("'\""))
    if as_json:
        emit(s)
        return
    per = s["seconds_per_judged_pair"]
    typer.echo(
        f"{s['users']} users, {s['candidates']} candidates: {s['yes']} YES, {s['added']} added "
        f"(per user: {json.dumps(s['added_per_user'])}), {s['failed']} failed"
        f"{f', {per} s per judged pair' if per else ''} -> {out}"
    )


def _arena_audit(run: str, out: str, as_json: bool) -> None:
    """``audit --arena``: the list-position audit of an arena run's verdicts."""
    from recjudge.data import DataError
    from recjudge.evaluators._audit import plot_positions, position_audit, position_lines
    from recjudge.reporting import write_report

    path = Path(run) / "verdicts.jsonl"
    fix = "pass the --out folder of a finished `recjudge arena run` (it holds verdicts.jsonl)"
    try:
        if not path.is_file():
            raise DataError("no such file.", source=str(path), fix=fix)
        records = []
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    raise DataError("not a JSON line.", source=str(path), row=n,
                                    fix=fix) from None  # fmt: skip
                if not isinstance(rec, dict):
                    raise DataError("not a verdict record.", source=str(path), row=n, fix=fix)
                records.append(rec)
        if not records:
            raise DataError("no verdict in it.", source=str(path), fix=fix)
        try:
            res = position_audit(records)
        except ValueError as e:
            raise DataError(str(e), source=str(path), fix=fix) from None
    except DataError as e:
        fail(str(e))
    header = ["# Arena list-position audit", "",
              f"{len(records)} verdicts from {path}: per aspect, the share of verdicts for "
              "each position over every judged order and, for pairs judged in both orders, "
              "how often the verdict changes when the lists swap places."]  # fmt: skip
    write_report(out, res, position_lines(res, header))
    plot_positions(res, Path(out) / "audit.png")
    if as_json:
        emit(res)
        return
    typer.echo("\n".join(position_lines(res, header)))
