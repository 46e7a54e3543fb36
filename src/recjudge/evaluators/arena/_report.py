"""RecSys Arena report: markdown lines and the win/tie/lose figure."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from recjudge.reporting import figure, interval


def plot_winrates(summary: dict[str, Any], path: Path) -> None:
    """Stacked win/tie/lose bars: each system against the reference (reference design) or
    every pair (round-robin), overall verdicts."""
    ref = summary.get("reference")
    if ref is not None:
        rows = {f"{s} vs {ref}": c for s, c in summary["reference_q"]["overall"].items()}
        rows = {
            k: {
                f"{x}_pct": 100.0 * c[x] / c["n"] if c["n"] else 0.0 for x in ("win", "tie", "lose")
            }
            for k, c in rows.items()
        }
        side = "system's"
    else:
        rows, side = summary["pairs"]["overall"], "first system's"
    names = list(rows)
    with figure(path, size=(8, 0.6 * len(names) + 1.5), dpi=120) as ax:
        left = np.zeros(len(names))
        for key, color in (("win_pct", "#4c9a2a"), ("tie_pct", "#bbbbbb"), ("lose_pct", "#c0392b")):
            vals = np.array([rows[n][key] for n in names])
            ax.barh(names, vals, left=left, color=color, label=key.split("_")[0])
            left += vals
        ax.set_xlabel(f"% of comparisons ({side} win / tie / lose)")
        ax.set_xlim(0, 100)
        ax.legend(loc="lower right")
        ax.set_title("RecSys Arena: overall verdicts")


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if v == float("inf"):
            return "inf"
        return f"{v:.2g}" if 0 < abs(v) < 1e-3 else f"{v:.3f}"
    return str(v)


def _header(config: Any, data: str, summary: dict[str, Any], n_users: int) -> list[str]:
    ref = summary.get("reference")
    if ref is None:
        design = "every pair in both orders"
    elif config.both_orders:
        design = (
            f"each system against the reference **{ref}**, judged in both orders (the order "
            f"with {ref} in position {config.reference_position} is the headline; the swapped "
            "order is the control)"
        )
    else:
        paper = " (the paper's protocol)" if config.reference_position == "B" else ""
        design = (
            f"each system in position {'A' if config.reference_position == 'B' else 'B'} "
            f"against the reference **{ref}** in position {config.reference_position}, one "
            f"order per user{paper}"
        )
    flip = summary.get("order_flip_rate")
    lines = [
        f"# RecSys Arena ({data}, judge {config.model})",
        "",
        f"{n_users} users, systems "
        f"{', '.join(config.system_names)}, top-{config.k} lists, {design}; "
        f"{config.analysis} analysis; {config.history_items} liked history items.",
    ]
    if flip is not None:
        ci = summary.get("order_flip_ci")
        lines.append(
            "Order-flip rate (overall verdict changes when A and B swap): "
            f"{_pct_band(flip, ci)}{' (95 % CI, users resampled)' if ci else ''}."
        )
    shares = summary.get("position_shares")
    if shares:
        lines.append(
            "Overall verdicts by position, every judged order: "
            + ", ".join(f"{o} {100 * shares[o]:.1f} %" for o in shares)
            + "."
        )
    cost = summary.get("cost")
    if cost:
        lines.append(
            f"Wall time {cost['wall_seconds']} s: {cost['asked_now']} of {cost['questions']} "
            f"questions asked in this run in {cost['asking_seconds']} s ({cost['per_second']} "
            "per second; the rest were read from the store)."
        )
    devs = config.deviations()
    lines += ["", "**Deviations from the paper:** " + ("; ".join(devs) if devs else "none") + "."]
    return lines


def _pct_band(v: float | None, ci: Any) -> str:
    """A rate in percent with its CI, "-" when undefined (results written before the rate)."""
    if v is None:
        return "-"
    return interval(v, *(ci or (None, None)), nd=1, scale=100, unit=" %")


def _p_band(v: float | None, ci: Any) -> str:
    """A probability to 4 places with its CI (judges' probabilities sit close to 0 or 1)."""
    if v is None:
        return "-"
    return interval(v, *(ci or (None, None)), nd=4)


def _reference_tables(summary: dict[str, Any]) -> list[str]:
    ref = summary["reference"]
    rq = summary["reference_q"]
    aspects = list(rq)
    lines = [
        "",
        f"## Each system against {ref} (Q = (win + tie) / (lose + tie), the system's side)",
        "",
        "| system | win | tie | lose | Q | Q 95 % CI (users) | "
        + " | ".join(f"Q {a}" for a in aspects[1:])
        + " |",
        "|---|---|---|---|---|---|" + "---|" * (len(aspects) - 1),
    ]
    cis = summary.get("reference_q_ci", {})
    for s, c in rq["overall"].items():
        per = " | ".join(_fmt(rq[a].get(s, {}).get("q")) for a in aspects[1:])
        ci = cis.get(s)
        band = f"[{_fmt(ci[0])}, {_fmt(ci[1])}]" if ci else "-"
        lines.append(
            f"| {s} | {c['win']} | {c['tie']} | {c['lose']} | {_fmt(c['q'])} | {band} | {per} |"
        )
    if "swap_rules" in summary:
        lines += [
            "",
            "### Position-bias control: both orders judged",
            "",
            "| system | Q one order (paper) | Q swap rule tie | Q swap rule keep "
            "| order-flip rate [95 % CI] | P(beats the reference), order-averaged [95 % CI] |",
            "|---|---|---|---|---|---|",
        ]
        sr = summary["swap_rules"]
        flips = summary.get("order_flip_by_system", {})
        flip_cis = summary.get("order_flip_by_system_ci", {})
        avg, avg_cis = summary.get("order_averaged", {}), summary.get("order_averaged_ci", {})
        for s, c in rq["overall"].items():
            lines.append(
                f"| {s} | {_fmt(c['q'])} | {_fmt(sr['tie']['overall'][s]['q'])} | "
                f"{_fmt(sr['keep']['overall'][s]['q'])} | "
                f"{_pct_band(flips.get(s), flip_cis.get(s))} | "
                f"{_p_band(avg.get(s), avg_cis.get(s))} |"
            )
    return lines


def _pair_tables(summary: dict[str, Any]) -> list[str]:
    pairs = summary["pairs"]
    lines = [
        "",
        "## Pairs (overall)",
        "",
        "| pair | win % | tie % | lose % | Q |",
        "|---|---|---|---|---|",
    ]
    for p, c in pairs["overall"].items():
        lines.append(
            f"| {p} | {c['win_pct']:.1f} | {c['tie_pct']:.1f} | {c['lose_pct']:.1f} | "
            f"{_fmt(c['q'])} |"
        )
    lines += [
        "",
        "## Q per aspect",
        "",
        "| pair | " + " | ".join(pairs) + " |",
        "|---|" + "---|" * len(pairs),
    ]
    for p in pairs["overall"]:
        lines.append(f"| {p} | " + " | ".join(_fmt(pairs[a][p]["q"]) for a in pairs) + " |")
    return lines


def arena_report(
    config: Any, data: str, offline: dict[str, Any], summary: dict[str, Any], n_users: int
) -> list[str]:
    """The report's markdown lines (header with deviations, offline metrics, Q tables,
    Bradley-Terry, correlations with p-values)."""
    k = config.k
    lines = _header(config, data, summary, n_users)
    lines += [
        "",
        "## Offline metrics",
        "",
        f"| system | AUC | nDCG@{k} | URD |",
        "|---|---|---|---|",
    ]
    for s, m in offline.items():
        lines.append(f"| {s} | {_fmt(m['auc'])} | {_fmt(m[f'ndcg@{k}'])} | {_fmt(m['urd'])} |")
    lines += _reference_tables(summary) if summary.get("reference") else _pair_tables(summary)
    lines += [
        "",
        "## Bradley-Terry (overall)",
        "",
        "| system | strength | 95 % CI | Q | AUC |",
        "|---|---|---|---|---|",
    ]
    for s, v in summary["bradley_terry"].items():
        ci = v["ci95"]
        lines.append(
            f"| {s} | {v['strength']:+.3f} | "
            f"{'-' if ci is None else f'[{ci[0]:+.2f}, {ci[1]:+.2f}]'} | "
            f"{_fmt(summary['system_q'].get(s))} | {_fmt(offline.get(s, {}).get('auc'))} |"
        )
    lines += ["", "## Correlation with AUC", ""]
    for name in (
        "corr_reference_q_auc",
        "corr_q_auc",
        "corr_bt_auc",
        "corr_order_averaged_auc",
        "corr_absolute_auc",
    ):
        if name in summary:
            c = summary[name]
            lines.append(
                f"- {name}: Pearson {_fmt(c['pearson'])} (p {_fmt(c.get('pearson_p'))}), "
                f"Spearman {_fmt(c['spearman'])} (p {_fmt(c.get('spearman_p'))}), "
                f"n = {c['n']} systems"
            )
    if "absolute_score" in summary:
        lines.append(
            "- absolute score (0-1, expected from the rating branch probabilities): "
            + ", ".join(f"{s} {v:.3f}" for s, v in summary["absolute_score"].items())
        )
    lines += ["", "![win/tie/lose](winrates.png)"]
    return lines


# -- list-level arena (our extension) ------------------------------------------------------
_SCORER_WORDS = {
    "brief": "BRIEF, sigma from {sigma} (none of the compared systems), beta {beta}",
    "llm-only": "the same prompt without the CF bias (BRIEF's no-behavior ablation): the LLM alone",
    "cf-only": "{sigma}'s sigma alone, P = (1 + sigma) / 2 (no LLM)",
}


def plot_list_scores(results: dict[str, Any], path: Path) -> None:
    """Per scorer, each system's mean list score (95 % user-bootstrap interval) against its
    AUC on the held-out item."""
    summary, offline = results["summary"], results["offline"]
    scorers = list(summary)
    with figure(path, size=(4.2 * len(scorers), 3.8), dpi=120, grid=(1, len(scorers))) as axes:
        for ax, scorer in zip(axes[0], scorers, strict=True):
            for s, m in summary[scorer]["mean_score"].items():
                auc = offline.get(s, {}).get("auc")
                if auc is None:
                    continue
                lo, hi = m["users"]["lo"], m["users"]["hi"]
                ax.errorbar(auc, m["estimate"], yerr=[[m["estimate"] - lo], [hi - m["estimate"]]],
                            fmt="o", capsize=3)  # fmt: skip
                ax.annotate(s, (auc, m["estimate"]), textcoords="offset points", xytext=(4, 4))
            ax.set_xlabel("AUC (held-out item)")
            ax.set_ylabel("mean list score")
            ax.set_title(scorer)


def arena_lists_report(config: Any, data: str, results: dict[str, Any]) -> list[str]:
    """The list-level arena's report: header (our extension, sigma source, scorers, margin,
    cost), then per scorer the systems' scores, Q against the reference and the rank
    correlations with AUC."""

    ref, offline, cost = results["reference"], results["offline"], results["cost"]
    n_users = len(results["users"])
    sigma = config.sigma_from
    lines = [
        "# List-level arena (our extension: not in the RecSys Arena paper)",
        "",
        f"- data **{data}**, {n_users} users (sampled by sha256 of the id, seed {config.seed}), "
        f"top-{config.k} lists of {', '.join(config.system_names)}; reference **{ref}**",
        f"- judge **{config.model}** ({config.dtype} dtype): every item of every list judged "
        "pointwise (a reward read-out at the decision step, the user's leave-one-out training "
        f"history, at most {config.history_items} items, in the prompt); no list is shown next "
        "to another, so no position enters",
        "- scorers: "
        + "; ".join(
            f"**{s}**: " + _SCORER_WORDS[s].format(sigma=sigma, beta=config.beta)
            for s in results["summary"]
        ),
        "- list score: mean P(YES) over the list weighted by "
        + ("1 / log2(rank + 1)" if config.discount == "log2" else "1 (no discount)")
        + f"; per user, a system wins / ties / loses against {ref} by the score difference "
        f"with tie margin {config.tie_margin}; Q = (win + tie) / (lose + tie)",
        f"- intervals: 95 % percentile, {config.bootstrap} user resamples",
        f"- **cost**: {cost['pairs']} distinct (user, item) pairs, {cost['llm_requests']} LLM "
        f"judgments asked ({cost['judged_now']} made in this run) from "
        f"{cost['decoding_passes']} decoding passes in {cost['judging_seconds']} s "
        f"({cost['passes_per_second']} passes/s), set-up {cost['setup_seconds']} s; "
        f"unbuildable pairs {cost['unbuilt']}, failed judgments "
        + ", ".join(f"{k} {v}" for k, v in cost["failed"].items()),
        "",
    ]
    for scorer, sm in results["summary"].items():
        lines += _scorer_section(scorer, sm, ref, offline)
    lines += ["![mean list score against AUC](scores.png)", ""]
    return lines


def _scorer_section(
    scorer: str, sm: Mapping[str, Any], ref: str, offline: Mapping[str, Any]
) -> list[str]:
    """One scorer's section: the systems by AUC with their list scores, differences to the
    reference, win/tie/lose and Q with intervals, then Q's and the score's correlation with
    AUC."""
    lines: list[str] = []
    lines += [
        f"## {scorer}",
        "",
        f"{sm['users_scored']} users with every list scored.",
        "",
        f"| system | AUC | mean list score | minus {ref} | win / tie / lose | Q [95 % CI] |",
        "|---|---|---|---|---|---|",
    ]
    order = sorted(sm["mean_score"], key=lambda s: -(offline[s]["auc"] or 0.0))
    for s in order:
        m = sm["mean_score"][s]
        d = sm["minus_reference"].get(s)
        q = sm["q"].get(s)
        lo_hi = (sm["q_ci"] or {}).get(s)
        lines.append(
            f"| {s} | {_fmt(offline[s]['auc'])} | "
            f"{interval(m['estimate'], m['users']['lo'], m['users']['hi'])} | "
            + (
                interval(d["estimate"], d["users"]["lo"], d["users"]["hi"], signed=True)
                if d
                else "(reference)"
            )
            + " | "
            + (f"{q['win']} / {q['tie']} / {q['lose']}" if q else "-")
            + " | "
            + (
                f"{_fmt(q['q'])}" + (f" [{_fmt(lo_hi[0])}, {_fmt(lo_hi[1])}]" if lo_hi else "")
                if q
                else "-"
            )
            + " |"
        )
    # Q is of the systems against the reference (an infinite Q is left out); the mean list
    # score is every system's, the reference's too.
    for what, key in (("Q", "corr_q_auc"), ("mean list score", "corr_score_auc")):
        c = sm[key]
        if c["pearson"] is None:
            lines.append(f"\n{what} vs AUC: undefined ({c['n']} systems with a finite "
                         f"{what}; it needs 3 and a {what} that varies)")  # fmt: skip
        else:
            lines.append(
                f"\n{what} vs AUC over {c['n']} systems: Pearson {c['pearson']:.2f} "
                f"(p {c['pearson_p']:.2f}), Spearman {c['spearman']:.2f} "
                f"(p {c['spearman_p']:.2f})"
            )
    lines.append("")
    return lines
