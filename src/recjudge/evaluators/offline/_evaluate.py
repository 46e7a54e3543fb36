"""Offline evaluation of several recommenders on logged-only and on imputed feedback.

Per system, ranx metrics on the same evaluation users under two qrels: the logged labels
alone, and logged + judge-imputed labels (``impute``). Between systems, ranx's paired tests
(``compare``). Between the two qrels, Kendall's tau of the system orderings per metric: how
much imputing unlabelled items changes which recommender looks best.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from recjudge._registry import suggest
from recjudge._stats import bootstrap_ci, bootstrap_ranks, user_draws
from recjudge._util import comma_list
from recjudge.evaluators.offline._runs import Qrels, RecRun
from recjudge.reporting import figure, interval

QRELS_KINDS = ("logged", "imputed")
# ranx's binary-relevance metrics (``name@k``; ``ndcg_burges`` is ranx's exp-gain nDCG).
METRICS = ("hits", "hit_rate", "precision", "recall", "f1", "r-precision", "mrr", "map",
           "ndcg", "ndcg_burges")  # fmt: skip


class EvaluateConfig(BaseModel):
    """``evaluate`` settings.

    Attributes:
        metrics: ranx metric names with cut-offs, e.g. ``ndcg@10``.
        k: rankings are cut to their top-k (the k that ``impute`` judged).
        stat_test: ranx's paired test: ``student`` (t-test), ``fisher`` (randomisation),
            or ``tukey`` (HSD): the paired tests ranx offers.
        max_p: significance level for the report's markers.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    metrics: tuple[str, ...] = Field(
        ("ndcg@10", "precision@10", "recall@10", "mrr@10"),
        description="ranx metrics with cut-offs, comma-separated.",
    )
    k: int = Field(20, ge=1, description="Rankings are cut to their top-k.")
    stat_test: Literal["student", "fisher", "tukey"] = Field(
        "student", description="student (paired t-test), fisher (randomisation), tukey."
    )
    max_p: float = Field(0.05, gt=0, lt=1, description="Significance level of the markers.")

    @field_validator("metrics", mode="before")
    @classmethod
    def _from_text(cls, metrics: Any) -> Any:
        # "ndcg@10,recall@10", as the command line and a hand-written config give them
        return comma_list(metrics)

    @field_validator("metrics")
    @classmethod
    def _known(cls, metrics: tuple[str, ...]) -> tuple[str, ...]:
        if not metrics:
            raise ValueError("give at least one metric, e.g. ndcg@10")
        for m in metrics:
            name, _, cut = m.partition("@")
            if name not in METRICS or (cut and not cut.isdigit()):
                close = suggest(name, list(METRICS))
                hint = f" Did you mean {close[0]}@{cut or 10}?" if close else ""
                raise ValueError(f"unknown metric {m!r}.{hint} Known: {', '.join(METRICS)} "
                                 "(with @k for a cut-off)")  # fmt: skip
        return metrics

    @model_validator(mode="after")
    def _cut_within_k(self) -> EvaluateConfig:
        # Rankings are cut to k before any metric sees them: a metric@10 on lists of 3 would
        # be reported as "@10" while it measured the top 3.
        for m in self.metrics:
            cut = m.partition("@")[2]
            if cut and int(cut) > self.k:
                raise ValueError(
                    f"metric {m} looks at the top {cut} but --k {self.k} cuts every ranking to "
                    f"{self.k} items; use --k {cut} or more, or {m.partition('@')[0]}@{self.k}"
                )
        return self


# ranx turns item ids into numpy fixed-width strings and numba compiles its data-structure
# kernels once per width (the longest id), ~40 s on 2 cores for each new width. Codes of one
# width make every dataset use the kernels set-up compiled (scripts/warm_jit.py).
ID_WIDTH = 10


def _ranx(qrels: Qrels, runs: Sequence[RecRun], users: Sequence[str], k: int):
    """ranx Qrels and Runs of ``users``, item ids replaced by fixed-width codes (one mapping
    for the qrels and every run, so matches are unchanged; scores are distinct ranks, so no
    tie is broken by id)."""
    from ranx import Qrels as RQrels
    from ranx import Run as RRun

    codes: dict[str, str] = {}

    def code(item: str) -> str:
        c = codes.get(item)
        if c is None:  # formatted once per item, not once per occurrence
            c = codes[item] = f"{len(codes):0{ID_WIDTH}d}"
        return c

    # Only positives: ranx ignores 0 labels. A user with none (evaluation users are chosen
    # without looking at labels) keeps an empty entry and scores 0; make_comparable scores a
    # user a run lacks as 0 rather than dropping it.
    q = RQrels({u: {code(i): r for i, r in qrels.get(u, {}).items() if r > 0} for u in users})
    rs = [
        RRun({u: {code(i): s for i, s in ranked.items()} for u, ranked in
              r.to_ranx(k, users).items()}, name=r.name)
        for r in runs
    ]  # fmt: skip
    return q, rs


def _p(value: float) -> float | None:
    """A p-value, or None where the test is undefined (identical scores on every user)."""
    value = float(value)
    return None if value != value else value


def kendall_tau(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Kendall's tau-b between two score vectors (None with fewer than two systems or a
    constant vector)."""
    from scipy.stats import kendalltau

    if len(a) < 2:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tau = kendalltau(a, b).statistic
    return None if tau != tau else float(tau)


def _difference(d: Any, idx: Any) -> dict[str, Any]:
    """A paired difference over users: its mean and 95 % user bootstrap interval."""
    ci = list(bootstrap_ci(d[idx].mean(axis=1))) if idx is not None else None
    return {"value": float(d.mean()), "ci": ci}


def evaluate_runs(
    qrels: Mapping[str, Qrels],
    runs: Sequence[RecRun],
    users: Sequence[str],
    config: EvaluateConfig,
    *,
    draws: int = 1000,
    seed: int = 0,
) -> dict[str, Any]:
    """Metrics per qrels kind and system, paired tests, and ordering agreement.

    Args:
        qrels: ``{"logged": ..., "imputed": ...}`` (``imputed`` optional).
        runs: the systems (names unique).
        users: the evaluation users (the same for every qrels kind).

    Returns:
        ``{"users", "metrics", "scores": {kind: {system: {metric: value}}},
        "intervals": {kind: {system: {metric: [lo, hi]}}}, "differences": {kind: {metric:
        {"a - b": {"value", "ci"}}}}, "tests": {kind: {metric: {"a vs b": p}}},
        "kendall_tau": {metric: tau}, "winners": {kind: {metric: system}}}``. Intervals are
        95 % percentile intervals over ``draws`` user resamples (``_stats.user_draws``, the
        same resamples for every system, metric and qrels kind, so differences are paired).
    """
    from ranx import compare
    from ranx import evaluate as ranx_evaluate

    names = [r.name for r in runs]
    if len(set(names)) != len(names):
        raise ValueError(f"two runs share a name ({names}); rename a file or pass NAME=PATH")
    out: dict[str, Any] = {"users": len(users), "metrics": list(config.metrics), "scores": {},
                           "intervals": {}, "differences": {}, "tests": {},
                           "winners": {}}  # fmt: skip
    idx = user_draws(len(users), draws, seed) if draws and len(users) > 1 else None
    boots: dict[str, dict[str, Any]] = {}
    for kind, q in qrels.items():
        rq, rs = _ranx(q, runs, users, config.k)
        per_user = {}
        for r in rs:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                got = ranx_evaluate(rq, r, list(config.metrics), return_mean=False,
                                    make_comparable=True)  # fmt: skip
            got = got if isinstance(got, dict) else {config.metrics[0]: got}
            per_user[r.name] = {m: np.asarray(got[m], dtype=float) for m in config.metrics}
        out["intervals"][kind] = {
            n: {m: (list(bootstrap_ci(per_user[n][m][idx].mean(axis=1)))
                    if idx is not None else None) for m in config.metrics}
            for n in names
        }  # fmt: skip
        out["differences"][kind] = {
            m: {f"{a} - {b}": _difference(per_user[a][m] - per_user[b][m], idx)
                for a, b in itertools.combinations(names, 2)}
            for m in config.metrics
        }  # fmt: skip
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rep = compare(rq, rs, list(config.metrics), stat_test=config.stat_test,
                          max_p=config.max_p, make_comparable=True).to_dict()  # fmt: skip
        out["scores"][kind] = {n: {m: float(rep[n]["scores"][m]) for m in config.metrics}
                               for n in names}  # fmt: skip
        out["tests"][kind] = {
            m: {f"{a} vs {b}": _p(rep[a]["comparisons"][b][m])
                for a, b in itertools.combinations(names, 2)}
            for m in config.metrics
        }  # fmt: skip
        out["winners"][kind] = {m: max(names, key=lambda n: out["scores"][kind][n][m])
                                for m in config.metrics}  # fmt: skip
        if idx is not None:
            boots[kind] = {m: np.stack([per_user[n][m][idx].mean(axis=1) for n in names])
                           for m in config.metrics}  # fmt: skip
            out.setdefault("ranks", {})[kind] = _ranks(boots[kind], names,
                                                       out["scores"][kind])  # fmt: skip
    if len(qrels) == 2 and len(boots) == 2:
        out |= _orderings_agree(out["scores"], boots, names, config.metrics)
    return out


def _orderings_agree(
    scores: Mapping[str, Any],
    boots: Mapping[str, Mapping[str, Any]],
    names: Sequence[str],
    metrics: Sequence[str],
) -> dict[str, Any]:
    """Kendall's tau between the systems' orderings under logged and imputed qrels, per
    metric, with its 95 % percentile interval over the same user resamples (``boots``:
    ``{kind: {metric: [systems, draws]}}``). With an interval or not at all: tau between
    two orderings whose differences all sit inside their intervals is noise (+-1 from a coin
    flip with two systems)."""
    tau = {m: kendall_tau([scores["logged"][n][m] for n in names],
                          [scores["imputed"][n][m] for n in names]) for m in metrics}  # fmt: skip
    ci: dict[str, Any] = {}
    for m in metrics:
        pairs = zip(boots["logged"][m].T, boots["imputed"][m].T, strict=True)
        taus = [kendall_tau(a, b) for a, b in pairs]
        kept = np.array([t for t in taus if t is not None])
        ci[m] = list(bootstrap_ci(kept)) if len(kept) else None
    return {"kendall_tau": tau, "kendall_tau_ci": ci}


def _ranks(boot: Mapping[str, Any], names: Sequence[str],
           scores: Mapping[str, Mapping[str, float]]) -> dict[str, dict[str, Any]]:  # fmt: skip
    """Per system and metric: its rank and rank interval (``_stats.bootstrap_ranks``) over
    the shared user resamples (``boot[metric]``: [systems, draws])."""
    out: dict[str, dict[str, Any]] = {n: {} for n in names}
    for m, b in boot.items():
        for n, r in zip(names, bootstrap_ranks(b, [scores[n][m] for n in names]), strict=True):
            out[n][m] = r
    return out


def report_lines(res: Mapping[str, Any], header: Sequence[str]) -> list[str]:
    """Markdown: the ranx metrics of each qrels kind with their 95 % user intervals side by
    side (``imputed`` is the BRIEF paper's protocol: biased, see the estimators), the paired
    differences between systems with intervals and p-values, and Kendall's tau."""
    kinds = list(res["scores"])
    systems = list(res["scores"][kinds[0]])
    named = {"imputed": "imputed, BRIEF protocol, biased"}
    lines = [*header, "", "## ranx metrics", "", f"Evaluation users: {res['users']}. Values "
             "with 95 % intervals over resampled users.", ""]  # fmt: skip
    cols = [f"{m} ({named.get(k, k)})" for m in res["metrics"] for k in kinds]
    lines += ["| system | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    ints = res.get("intervals", {})
    for n in systems:
        vals = [interval(res["scores"][k][n][m], *((ints.get(k, {}).get(n, {}).get(m))
                                                  or (None, None)), nd=4)
                for m in res["metrics"] for k in kinds]  # fmt: skip
        lines.append(f"| {n} | " + " | ".join(vals) + " |")
    if res.get("ranks"):
        lines += ["", "Rank of each system (1 = best) with its 95 % interval over resampled "
                  "users; a system is best only where its interval is [1, 1]:", ""]  # fmt: skip
        for k in kinds:
            for m in res["metrics"]:
                r = res["ranks"].get(k, {})
                lines.append(f"- {named.get(k, k)}, {m}: " + "; ".join(
                    f"{n} {r[n][m]['rank']} [{r[n][m]['rank_ci'][0]}, {r[n][m]['rank_ci'][1]}]"
                    for n in systems if m in r.get(n, {})))  # fmt: skip
    if res.get("kendall_tau_ci"):
        lines += ["", "Kendall's tau between the system orderings (logged vs imputed), 95 % "
                  "interval over resampled users:", ""]  # fmt: skip
        for m, t in res["kendall_tau"].items():
            ci = res["kendall_tau_ci"].get(m)
            if t is not None and ci:
                lines.append(f"- {m}: {interval(t, *ci, nd=3)}")
    # The intervals only: a paired test's p-value beside a bootstrap interval can disagree
    # with it (p = 0.10 beside an interval that excludes 0); ranx's p-values stay in
    # results.json ("tests") for whoever wants that test.
    lines += ["", "Paired differences between systems (95 % interval over resampled users; "
              "one that holds 0 does not separate them):", ""]  # fmt: skip
    for k in kinds:
        for m, diffs in (res.get("differences", {}).get(k) or {}).items():
            shown = [f"{pair} {interval(d['value'], *(d['ci'] or (None, None)), nd=4)}"
                     for pair, d in diffs.items()]  # fmt: skip
            lines.append(f"- {named.get(k, k)}, {m}: {'; '.join(shown)}")
    return lines


def plot_scores(res: Mapping[str, Any], path: str | Path) -> None:
    """Grouped bars: per metric, each system's logged-only and imputed value."""
    kinds = list(res["scores"])
    systems = list(res["scores"][kinds[0]])
    metrics = res["metrics"]
    with figure(path, size=(3.2 * len(metrics), 3.4), dpi=110, grid=(1, len(metrics))) as axes:
        x = np.arange(len(systems))
        width = 0.8 / len(kinds)
        for ax, m in zip(axes[0], metrics, strict=True):
            for j, k in enumerate(kinds):
                ax.bar(x + j * width, [res["scores"][k][n][m] for n in systems], width, label=k)
            ax.set_xticks(x + width * (len(kinds) - 1) / 2, systems, rotation=30, ha="right")
            ax.set_title(m)
        axes[0][0].legend(fontsize=8)
