"""GISTBench's report: the markdown header, score tables and notes, and the precision /
recall scatter."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from recjudge.evaluators._cost import cost_sentence
from recjudge.evaluators.gist._metrics import GIST_METRICS
from recjudge.reporting import figure, interval

if TYPE_CHECKING:
    from recjudge.evaluators.gist._config import GistConfig


def _pr_draw(ax: Any, scores: Mapping[str, Any], data: str) -> None:
    """Per-user IG precision against recall, one colour per model for its dots and its median."""
    for i, (m, s) in enumerate(scores.items()):
        # An explicit colour: each scatter() call takes the next colour of the cycle, which
        # would give a model's median star another model's colour.
        color = f"C{i % 10}"
        ps = [v["ig_p"] for v in s["users"].values()]
        rs = [v["ig_r"] for v in s["users"].values()]
        ax.scatter(rs, ps, alpha=0.35, s=18, color=color)
        ax.scatter(
            [s["ig_r"]],
            [s["ig_p"]],
            marker="*",
            s=220,
            color=color,
            edgecolor="k",
            label=f"{m} (median)",
        )
    ax.set_xlabel("IG recall (per user)")
    ax.set_ylabel("IG precision (per user)")
    ax.set_xlim(-0.03, 1.03)
    ax.set_ylim(-0.03, 1.03)
    ax.set_title(f"GISTBench groundedness on {data}")
    ax.legend(loc="lower right", fontsize=8)


def plot_pr(scores: Mapping[str, Any], path: Path, data: str) -> None:
    with figure(path, size=(6, 5), dpi=120) as ax:
        _pr_draw(ax, scores, data)


def _iv(c: Mapping[str, float] | None) -> str:
    return "" if not c else " " + interval(None, c["lo"], c["hi"])


def _signed(d: Mapping[str, float]) -> str:
    """A difference with its interval, signed: ``+0.123 [+0.010, +0.240]``."""
    return interval(d["estimate"], d["lo"], d["hi"], signed=True)


def _cost_line(results: Mapping[str, Any]) -> str:
    labels = {
        "extraction": "extraction answers (models under test)",
        "judge": "judge questions (evidence filter, taxonomy, specificity)",
    }
    return cost_sentence(results["wall_seconds"], results.get("cost") or {}, labels)


_RULE_TEXT = {
    "likelihood": " (the category whose whole name is most likely)",
    "greedy": " (category decoded token by token, which follows the first letters)",
}


def gist_report(config: GistConfig, data: str, results: Mapping[str, Any]) -> list[str]:
    """The markdown report's lines, in the order a reader checks them: protocol, scores,
    failure modes and counts."""
    return (
        _report_header(config, data, results)
        + _report_scores(results)
        + _report_notes(config, results)
        + ["", "![precision-recall](pr.png)"]
    )


def _report_header(config: GistConfig, data: str, results: Mapping[str, Any]) -> list[str]:
    """Title, protocol line, deviations and what is always ours."""
    devs = list(results.get("deviations", config.deviations()))
    span = f"most recent {config.max_history}" if config.max_history else "whole history"
    return [
        f"# GISTBench on {data}",
        "",
        f"Judge: `{config.judge}`; {len(results['users'])} users (>= {config.min_history} "
        f"interactions, {span}), chunks of {config.chunk_size}, {config.options} options per "
        "specificity question, pool of "
        f"{results['pool_size']}, taxonomy {config.taxonomy}"
        f"{_RULE_TEXT.get(results.get('taxonomy_rule'), '')}, seed {config.seed}. "
        + _cost_line(results),
        "",
        *_sample_line(results),
        "**Deviations from the paper:** " + ("; ".join(devs) if devs else "none") + ".",
        "",
        f"Always ours: an extraction answer is cut at {config.extraction_tokens} tokens (the "
        "paper sets no bound; a cut answer keeps its complete entries and is counted below).",
        "",
    ]


def _sample_line(results: Mapping[str, Any]) -> list[str]:
    """``gist verify --users``: which users were scored, and how to extend them."""
    s = results.get("user_sample")
    if not s:
        return []
    return [
        f"Users: {s['users']} sampled in sha256 order (`--users {s['asked']}`) among the "
        f"{s['in_every_file']} with interests in every file ({s['profiled']} profiled); a "
        "larger `--users` extends this sample, and a rerun into the same `--out` keeps every "
        "answer.",
        "",
    ]


def _report_scores(results: Mapping[str, Any]) -> list[str]:
    """The score table with intervals, IG_P minus IG_R and the paired model differences."""
    s = results["scores"]
    lines = [
        "Medians over users (higher is better), with 95 % intervals over users (bootstrap, "
        "users resampled) where computed.",
        "",
        "| system (model or profile file) | IG_P | IG_R | IG_F1 | IS | interests | verified % |",
        "|---|---|---|---|---|---|---|",
    ]
    iv = results.get("intervals") or {}
    for m, v in s.items():
        cells = [f"{v[k]:.3f}{_iv(iv.get(m, {}).get(k))}" for k in GIST_METRICS]
        lines.append(f"| {m} | {' | '.join(cells)} | {v['interests']} | {v['verified_pct']:.1f} |")
    if iv:
        lines += [
            "",
            "IG_P minus IG_R (mean over users; the paper finds coverage, not precision, the "
            "bottleneck, i.e. this above 0):",
            "",
        ]
        lines += [f"- {m}: {_signed(v['p_minus_r'])}" for m, v in iv.items()]
    diffs = results.get("differences") or {}
    if diffs:
        lines += [
            "",
            "Model differences (median minus median; 95 % intervals with users resampled, the "
            "same users for both models; an interval containing 0: not separated at this size):",
            "",
        ]
        for pair, d in diffs.items():
            cells = ", ".join(f"{k.upper()} {_signed(d[k])}" for k in GIST_METRICS)
            lines.append(f"- {pair}: {cells}")
    return lines


def _report_notes(config: GistConfig, results: Mapping[str, Any]) -> list[str]:
    """Failure modes (Table 7), example echoes, taxonomy agreement and the run's counts."""
    s = results["scores"]
    lines = ["", "Failure modes (% of each model's unverified interests; not exclusive):", ""]
    for m, v in s.items():
        fm = ", ".join(f"{k} {p:.1f}%" for k, p in v["failure_pct"].items()) or "none"
        lines.append(f"- {m} ({v.get('unverified', 0)} unverified): {fm}")
    example = results.get("prompt_example")
    if example:  # interests from our extraction prompt (not ``gist verify``'s profiles)
        lines += [
            "",
            f'Interests that repeat the prompt\'s example ("{example}", up to its numbers): '
            + "; ".join(
                f"{m} {v.get('echoes_example', 0)} of {v['interests']} "
                f"({v.get('echoes_verified', 0)} verified)"
                for m, v in s.items()
            )
            + ".",
        ]
    # Our prompt's tags, so only for its answers; results written before the count: no line.
    if example and any("signal_names" in v for v in s.values()):
        lines += [
            "",
            'Interests that only name an engagement signal of the prompt ("explicit '
            'positive", "implicit negative", ...; no topic): '
            + "; ".join(
                f"{m} {v['signal_names']} of {v['interests']} "
                f"({v['signal_names_verified']} verified)"
                for m, v in s.items()
            )
            + ".",
        ]
    agree = results.get("taxonomy_agreement")
    if agree:
        lines += [
            "",
            f"Shortlist taxonomy agrees with the full 325-category choice on "
            f"{agree['agree']} of {agree['n']} sampled interests "
            f"({agree['agree_pct']:.1f} %).",
        ]
    lines += [
        "",
        f"Extraction answers cut by the token budget (complete entries kept): "
        f"{results['incomplete_extractions']}; citations beyond the instructed "
        f"{config.max_citations}-interests-per-object rule: "
        f"{results.get('over_limit_citations', 0)} "
        f"({'dropped' if config.enforce_citations else 'kept, as the paper'}); "
        "distractors the judge called related but used to fill the option list (least "
        f"related first): {results['filled_distractors']}.",
    ]
    return lines
