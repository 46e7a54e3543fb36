"""``bench judge-tuning``: does a judge tuned on the team's log, or an imputer fitted on gold
labels, tell relevant from irrelevant better than the prompted judge and CF alone?

Protocol (``brief-ratings``' held-out pairs, so the rows compare with that report):

1. ``brief-ratings`` draws its evaluation users and their held-out pairs: per user, the
   last ``future_fraction`` of the timeline is the future; ``relevance_pairs`` future items
   (label 1) and as many never-rated items (label 0), plus rating pairs per level.
2. ``judge tune`` tunes the model on the **past** split only, with every evaluation user
   excluded (``--exclude-users``): the tuned judge never saw those users, past or future.
3. The base model is judged as zero-shot, evidence-first without bias (``no-behavior``) and
   BRIEF (sigma from the positive-only CF model), and ``cf-only`` reads sigma alone; the
   tuned folder is judged as ``no-behavior`` and BRIEF with the same sigma. Read-outs (the
   decision step's P(YES)), greedy, through each run's store.
4. The supervised imputer (``evaluators.offline._supervised``, logistic regression) is fitted on the
   relevance labels of the evaluation pairs themselves, cross-fitted over users (each user's
   pairs are scored by a model fitted on the other users): the base BRIEF judge's log-odds,
   its unbiased log-odds, sigma, item popularity and history length as features.

Each row: relevance AUC (future item vs never-rated item) and pair Spearman with the held-out
rating, with bootstrap intervals; paired differences on the same pairs (``setting_difference``).
Cost: tuning seconds per 1,000 training examples on this machine, and each run's judgments per
second (tuned vs base, like for like: same pairs, same engine, same read-out).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from pydantic import ConfigDict, Field

from recjudge.bench._brief import (
    BriefExperimentConfig,
    _analyse,
    _requests,
    _run,
    _scores,
    _speed,
    _targets,
)
from recjudge.bench._brief_stats import setting_difference
from recjudge.bench._tuning_check import check_lines, teacher_forced_check
from recjudge.data import load_dataset
from recjudge.evaluators.offline import features_of, fit_imputer
from recjudge.llm import read_card
from recjudge.reporting import write_report
from recjudge.tune import TuneConfig, tune

#: the rows judged with the base model and with the tuned folder: (name, mode, CF source)
BASE_ROWS = (("zero-shot", "zero-shot", "-"), ("no-behavior", "no-behavior", "-"),
             ("brief [cf:positive]", "brief", "positive"),
             ("cf-only [cf:positive]", "cf-only", "positive"))  # fmt: skip
TUNED_ROWS = (("tuned no-behavior", "no-behavior", "-"),
              ("tuned brief [cf:positive]", "brief", "positive"))  # fmt: skip
SUPERVISED_ROW = "supervised:logistic"
#: the paired differences the report shows (row A minus row B on the same pairs)
PAIRED = (("tuned no-behavior", "no-behavior"),
          ("tuned brief [cf:positive]", "brief [cf:positive]"),
          ("tuned brief [cf:positive]", "cf-only [cf:positive]"),
          ("tuned no-behavior", "zero-shot"), (SUPERVISED_ROW, "brief [cf:positive]"),
          (SUPERVISED_ROW, "cf-only [cf:positive]"),
          (SUPERVISED_ROW, "tuned brief [cf:positive]"))  # fmt: skip


class JudgeTuningConfig(BriefExperimentConfig):
    """``brief-ratings``' settings (its pairs) plus the tuning's.

    Attributes:
        tune_steps: optimiser steps (``judge tune``'s ``--steps``).
        tune_batch: pairs per step (``--batch-size``).
        tune_lr: the learning rate (``--lr``).
        tune_eval_every: validation AUC every N steps (``--eval-every``).
        tune_patience: evaluations without a better AUC before stopping (``--patience``).
        tune_decision_weight: the decision margin's loss weight (``--decision-weight``).
        tune_users: most training users.
        tune_validation_users: users held out for early stopping.
        teacher_forced: run ``_tuning_check`` (where a validation gain goes: the adapter as
            trained, the merged folder, other users, the evaluation pairs; one score).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = "smollm2-135m"
    users: int = Field(60, ge=2)
    history_items: int = Field(20, ge=1)
    tune_steps: int = Field(150, ge=1)
    tune_batch: int = Field(4, ge=1)
    tune_lr: float = Field(2e-4, gt=0)
    tune_eval_every: int = Field(25, ge=1)
    tune_patience: int = Field(3, ge=1)
    tune_decision_weight: float = Field(0.0, ge=0)
    tune_users: int = Field(300, ge=1)
    tune_validation_users: int = Field(40, ge=2)
    teacher_forced: bool = True


def _tuned_folder(config: JudgeTuningConfig, ds: Any, past: Any, users: list[str], out: Path,
                  progress: bool) -> tuple[Path, dict[str, Any]]:  # fmt: skip
    """The tuned model (reused when ``out/tuned-model`` holds one; resumed when its checkpoint
    folder is there) and its card."""
    folder = out / "tuned-model"
    card = read_card(folder) if folder.is_dir() else None
    if card is not None:
        return folder, card
    tc = TuneConfig(model=config.model, max_history=config.history_items,
                    future_fraction=config.future_fraction, steps=config.tune_steps,
                    batch_size=config.tune_batch, lr=config.tune_lr,
                    eval_every=config.tune_eval_every, patience=config.tune_patience,
                    decision_weight=config.tune_decision_weight,
                    max_users=config.tune_users, validation_users=config.tune_validation_users,
                    positives_per_user=2, seed=config.seed)  # fmt: skip
    log = ds.with_interactions(past, "judge-tuning: the past split")
    resume = (Path(f"{folder}.tune") / "state.json").is_file()
    tune(tc, log, folder, exclude_users=users, resume=resume, progress=progress, log=print)
    return folder, read_card(folder)  # as written (with the folder's dtype and digests)


def _supervised(reqs: list[Any], brief: list[Any], past: Any) -> tuple[list[Any], Any]:
    """The supervised imputer's pseudo-judgments per request (cross-fitted over users on the
    relevance labels) and the fit."""
    pop = past["item_id"].astype(str).value_counts().to_dict()
    rows, gold = {}, {}
    for r, j in zip(reqs, brief, strict=True):
        key = (r.user_id, r.candidate_id)
        rec = {
            "item_id": r.candidate_id,
            "p_yes": j.p_yes,
            "p_yes_semantic": j.p_yes_semantic,
            "sigma": j.sigma,
            "history_len": len(r.history),
            "evidence": j.evidence,
        }
        rows[key] = features_of(rec, pop)
        if r.meta["kind"] == "relevance":
            gold[key] = int(r.meta["label"])
    fitted = fit_imputer(rows, gold, "logistic", seed=0)
    out = []
    for r in reqs:
        p = fitted.p[(r.user_id, r.candidate_id)]
        q = min(max(p, 1e-12), 1 - 1e-12)
        out.append(SimpleNamespace(p_yes=p, log_odds=math.log(q / (1 - q)), is_relevant=p > 0.5))
    return out, fitted


def bench_judge_tuning(
    config: JudgeTuningConfig,
    out: str | Path = "reports/judge-tuning",
    llm: Any = None,
    progress: bool = True,
) -> dict[str, Any]:
    """The module's protocol; writes report.md and results.json under ``out``."""
    t0 = time.time()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ds = load_dataset(config.data)
    reqs, info = _requests(config, ds)
    past = info.pop("past")
    folder, card = _tuned_folder(config, ds, past, list(info["users"]), out, progress)
    runs = {}
    for label, cfg, rows, model_llm in (
        ("base", config, BASE_ROWS, llm),
        ("tuned", config.model_copy(update={"model": str(folder)}), TUNED_ROWS, None),
    ):
        t1 = time.time()
        named = [(n, m, s, config.beta) for n, m, s in rows]
        runs[label] = (_run(cfg, out / label, model_llm, progress, named), time.time() - t1)
    base, tuned = runs["base"][0], runs["tuned"][0]
    assert [r.candidate_id for r in base.reqs] == [r.candidate_id for r in tuned.reqs]
    results = {**base.results, **tuned.results}
    sup, fitted = _supervised(base.reqs, base.results["brief [cf:positive]"], past)
    results[SUPERVISED_ROW] = sup
    analysis = _analyse(base.reqs, results, config)
    ratings, labels = _targets(base.reqs)
    paired = {
        f"{a} - {b}": setting_difference(
            _scores(base.reqs, results[a], False), _scores(base.reqs, results[b], False),
            ratings, labels, config.bootstrap, (config.seed, a, b))
        for a, b in PAIRED
    }  # fmt: skip
    check = None
    if config.teacher_forced:
        check = teacher_forced_check(config, ds, past, base.reqs, list(info["users"]), folder,
                                     card)  # fmt: skip
    examples = card["steps"] * card["config"]["batch_size"]
    res = {
        "config": config.model_dump(),
        **{k: v for k, v in info.items() if k != "users"},
        "evaluation_users": len(info["users"]),
        "tuned_model": str(folder),
        "card": {k: card[k] for k in ("base_model", "steps", "best_step", "validation_auc",
                                      "validation_auc_before", "pairs", "seconds", "stopped",
                                      "train_seconds", "eval_seconds", "precision",
                                      "data", "history")},  # fmt: skip
        # the optimiser steps alone (forward, backward, update): not the validation passes,
        # the pairs' building or the model's loading, which the card times apart
        "tuning_seconds_per_1000_examples": (round(1000 * card["train_seconds"] / examples, 1)
                                             if examples else None),  # fmt: skip
        "speed": {label: {**_speed(j, wall), "wall_seconds": round(wall, 1)}
                  for label, (j, wall) in runs.items()},  # fmt: skip
        "supervised": {"method": fitted.method, "features": fitted.features,
                       "folds": fitted.folds, "gold_pairs": fitted.gold_pairs,
                       "gold_users": fitted.gold_users, "out_of_fold": fitted.oof},  # fmt: skip
        "rows": {name: {"relevance_auc": a["relevance_auc"], "pair_spearman": a["pair_spearman"],
                        "mean_p_yes": a["mean_p_yes"]} for name, a in analysis.items()},
        "paired": paired,
        "teacher_forced": check,
        "wall_seconds": round(time.time() - t0, 1),
    }  # fmt: skip
    write_report(out, res, _lines(config, res))
    return res


def _ci(d: dict[str, Any], key: str) -> str:
    v = d.get(key)
    if v is None:
        return "n/a"
    return f"{v:.3f} [{d['lo']:.3f}, {d['hi']:.3f}]" if d.get("lo") is not None else f"{v:.3f}"


def _lines(config: JudgeTuningConfig, r: dict[str, Any]) -> list[str]:
    c = r["card"]
    p = c["pairs"]
    s = r["supervised"]
    f = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
    lines = [
        f"# Judge tuning on the team's log: {config.data}, {config.model}",
        "",
        "Protocol: `brief-ratings`' held-out pairs of "
        f"{r['evaluation_users']} evaluation users (future items vs never-rated items; "
        f"held-out ratings), last {config.future_fraction:.0%} of each timeline held out. "
        f"`judge tune` read only the past split, every evaluation user excluded; "
        f"{config.history_items} history items in every prompt (tuning and judging). "
        "Read-outs (P(YES) at the decision step), greedy. Intervals: bootstrap "
        f"({config.bootstrap} resamples); paired differences on the same pairs.",
        "",
        f"Tuning: {p['train']} training pairs read ({p['train_positive']} positive; "
        f"{p.get('train_available', p['train'])} built from the log) of "
        f"{c['data']['users_read'] - p['validation_users']} users, {p['validation']} validation "
        f"pairs of {p['validation_users']} other users; {c['steps']} steps of "
        f"{config.tune_batch} (loss: the answer's tokens"
        f"{f' + {w:g} x the decision margin' if (w := config.tune_decision_weight) else ''}; "
        f"best step {c['best_step']}; {c['stopped'] or 'no early stop'}); "
        f"validation AUC of the teacher-forced decision score {f(c['validation_auc_before'])} "
        f"-> {f(c['validation_auc'])}; {c['seconds']} s in all ({c['train_seconds']} s of "
        f"optimiser steps, {c['eval_seconds']} s of validation), "
        f"{r['tuning_seconds_per_1000_examples']} s of optimiser steps per 1,000 training "
        f"examples on this CPU ({c['precision']} arithmetic).",
        "",
        f"Supervised imputer: {s['method']} on {', '.join(s['features'])}, cross-fitted over "
        f"{s['folds']} folds of the {s['gold_users']} evaluation users' {s['gold_pairs']} "
        "relevance labels (each user scored by a model fitted on the other users).",
        "",
        "| row | relevance AUC [95 % CI] | pair Spearman with rating [95 % CI] | mean P(YES) |",
        "|---|---|---|---|",
    ]
    for name, row in r["rows"].items():
        lines.append(f"| {name} | {_ci(row['relevance_auc'], 'auc')} | "
                     f"{_ci(row['pair_spearman'], 'rho')} | {f(row['mean_p_yes'])} |")  # fmt: skip
    lines += ["", "## Paired differences (A - B on the same pairs)", "",
              "| A - B | relevance AUC diff [95 % CI] | pair Spearman diff [95 % CI] |",
              "|---|---|---|"]  # fmt: skip
    for name, d in r["paired"].items():
        lines.append(f"| {name} | {_ci(d['relevance_auc'], 'diff')} | "
                     f"{_ci(d['pair_spearman'], 'diff')} |")  # fmt: skip
    sp = r["speed"]
    lines += ["", "## Cost", "",
              f"Judgment speed (read-outs, same pairs, same engine): base "
              f"{sp['base']['judgments_per_second']} judgments/s ({sp['base']['judged_now']} "
              f"judged now), tuned {sp['tuned']['judgments_per_second']} judgments/s "
              f"({sp['tuned']['judged_now']} judged now); a rerun reads the stores and judges "
              "nothing. Absolute figures hold for this machine only."]  # fmt: skip
    if r.get("teacher_forced"):
        lines += check_lines(r["teacher_forced"])
    return lines
