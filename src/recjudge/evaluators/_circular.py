"""Circular judges: a judge whose behavioural signal is one of the systems it evaluates.

BRIEF adds ``Delta = beta (1 + E_n) sigma`` to the judge's YES branch, with ``sigma`` from a
CF model. When that CF model is one of the compared recommenders, the judge says YES to what
that system ranks high, and its imputed metric is inflated by construction (on ML-100K with
SmolLM2, ALS's unlabelled listed pairs got mean sigma 0.89 and 100 % YES, Pop's -0.09 and
40 %). One rule decides it, for ``impute``, ``evaluate`` and ``arena lists``:

- **identity**: the run's provenance (``RUN.provenance.json``, written by ``cf recommend``)
  names the judge's CF model: the same ``model_fingerprint`` or the same folder; or, in the
  arena, the sigma model's name is a compared system's;
- **family**: the run's provenance names a model of the judge's CF model's family (``als``,
  ``bpr``, ...) trained on the same dataset, whatever its seed or folder: a retrained twin
  shares its taste (ALS retrained with another seed: 56 % top-10 overlap, yet the judge said
  YES to 97.7 % of that ALS's unlabelled pairs and its imputed precision@10 went from 0.410 to
  0.927);
- **behaviour**: the judge's CF model's own top-k lists hold at least ``OVERLAP_LIMIT`` of the
  run's top-k pairs (the run is that model in all but name: a copy, a run written by other
  tooling);
- **leniency** (``evaluate``, which has the log): a system whose judge YES rate on its
  unlabelled pairs, over its logged hit rate, is at least ``LENIENCY_LIMIT`` times the
  median of the other systems' (the judge favours it far beyond what the log says of it).
  Measured on the known-truth bench (1.5B, 200 evaluations,
  ``reports/brief-offline-estimators/ml-1m-qwen2.5-coder-1.5b/README.md``): no threshold
  separates its circular source's system (median ratio 1.21x the others') from honest ones
  (an independent source gives Pop 1.19x), so the 2x rule catches gross leniency only; the
  identity, family and behaviour rules are what refuse a circular source there.

Any refuses the job (``CircularJudgeError``) unless ``allow_circular``, which the report
header then names. ``judge_by_system`` puts the judge's YES rate and mean sigma on each
system's lists beside the logged hit rate so a lenient judge is visible.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from recjudge._util import UserFacingError, json_loads
from recjudge.cf_models import model_fingerprint

__all__ = [
    "OVERLAP_LIMIT",
    "SIGMA_FLAG",
    "SIGMA_REFUSE",
    "CircularJudgeError",
    "circular_message",
    "circular_systems",
    "judge_by_system",
    "leniency_ratios",
    "gold_leniency",
    "lenient_systems",
    "list_overlap",
    "refuse_circular",
    "related_systems",
    "sigma_source",
]

#: a run whose top-k pairs are at least this share of the CF model's own top-k is that model
#: (ML-100K, top-10: ALS with 2 of its 10 items swapped held 80 %; the honest item-kNN judge's
#: own lists held 30 % of ALS's and Pop's, 61 % of BPR's; ALS retrained under another seed 58 %)
OVERLAP_LIMIT = 0.75
#: the judge's mean sigma on a system's unlabelled pairs at or above which the judge's CF model
#: recommends what the system recommends: refused (``related_systems``). Measured on ML-100K
#: (150 users, top-10, sigma calibrated on validation as `cf train` does): a renamed copy of ALS
#: judged with ALS retrained under another seed 0.75 (YES 98 %), ALS with 2 items swapped judged
#: with ALS 0.71; a related model (BPR and item-kNN judged with ALS) 0.50-0.52; the honest
#: item-kNN judge on ALS, Pop and BPR -0.00, 0.01 and 0.35
SIGMA_REFUSE = 0.6
#: ... and at or above which it is flagged in every output as a related model (its YES rate gap
#: and list overlap named)
SIGMA_FLAG = 0.4
#: a system whose (judge YES rate / logged hit rate) is this many times the other systems'
#: median is favoured by the judge (the leniency rule)
LENIENCY_LIMIT = 2.0

FIXES = ("a sigma source independent of the compared systems (--cf of a model trained for the "
         "judge that is none of them, e.g. `recjudge cf train itemknn --data DATA --out "
         "runs/judge-cf`), --mode no-behavior (no CF), or --allow-circular to go on knowing the "
         "named system's metric is inflated")  # fmt: skip


class CircularJudgeError(UserFacingError, ValueError):
    """The judge's sigma source is one of the evaluated systems."""


def circular_message(system: str, why: str, fixes: str = FIXES) -> str:
    """The one-line refusal: which system, why it is the judge's own signal, what to do."""
    return (
        f"the judge's CF signal is the evaluated system {system!r} ({why}): the judge "
        f"would say YES to what {system!r} ranks high and inflate its imputed metric by "
        f"construction. Use {fixes}"
    )


def refuse_circular(found: Mapping[str, str], allow: bool) -> None:
    """Raise ``CircularJudgeError`` for the first system ``circular_systems`` found, unless
    ``allow``."""
    if found and not allow:
        name, why = next(iter(found.items()))
        raise CircularJudgeError(circular_message(name, why))


def sigma_source(
    cf: str | None, uses_cf: bool, dataset: str | None = None
) -> dict[str, Any] | None:
    """The judge's sigma source as a record (folder, model name, fingerprint, the dataset it
    judges), or None when the judge uses no CF model."""
    if not cf or not uses_cf:
        return None

    path = Path(cf)
    try:
        meta = json_loads((path / "model.json").read_text(encoding="utf-8"))
        name = str(meta.get("model")) if isinstance(meta, dict) else None
        fingerprint = model_fingerprint(path)
    except (OSError, ValueError):
        return {"folder": str(path), "model": None, "fingerprint": None,
                "dataset": dataset}  # fmt: skip
    return {"folder": str(path), "model": name, "fingerprint": fingerprint,
            "dataset": dataset}  # fmt: skip


def circular_systems(
    source: Mapping[str, Any] | None,
    runs: Sequence[Any],
    overlap: Mapping[str, float] | None = None,
) -> dict[str, str]:
    """``{system: why}`` for each run the rule (module docstring) finds to be the judge's own
    signal; empty when the judge has no CF source (no ``source``, no ``overlap``)."""
    if not source and not overlap:
        return {}
    source = source or {}
    out: dict[str, str] = {}
    for run in runs:
        prov = run.provenance or {}
        fp, folder = prov.get("model_fingerprint"), prov.get("model_folder")
        if fp and fp == source.get("fingerprint"):
            out[run.name] = f"{run.path} was written by the same CF model, {source['folder']}"
        elif folder and folder == source.get("folder"):
            out[run.name] = f"{run.path} was written from the judge's CF folder {folder}"
        elif _same_family(prov, source):
            out[run.name] = (f"{run.path} was written by a {prov['model']} model trained on "
                             f"{prov.get('dataset')}, the family and data of the judge's CF "
                             f"model {source.get('folder')}: a retrained twin shares its "
                             "taste, whatever its seed or folder")  # fmt: skip
        elif overlap and overlap.get(run.name, 0.0) >= OVERLAP_LIMIT:
            out[run.name] = (f"{overlap[run.name]:.0%} of its top-k pairs are the judge's CF "
                             f"model's own top-k")  # fmt: skip
    return out


def _same_family(prov: Mapping[str, Any], source: Mapping[str, Any]) -> bool:
    """The run's model is of the sigma source's family and trained on its dataset (a dataset
    either side does not record is taken as the same)."""
    model = prov.get("model")
    if not model or model != source.get("model"):
        return False
    a, b = prov.get("dataset"), source.get("dataset")
    return not a or not b or a == b


def leniency_ratios(by_system: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
    """Per system, its judge YES rate over its logged hit rate, divided by the median of the
    other systems' (what the leniency rule compares with ``LENIENCY_LIMIT``); systems
    without both rates, or whose others' median is 0, get none."""
    ratio = {n: d["judge_yes_rate"] / d["logged_hit_rate"] for n, d in by_system.items()
             if d.get("judge_yes_rate") is not None and d.get("logged_hit_rate")}  # fmt: skip
    out = {}
    for n, r in ratio.items():
        others = [v for m, v in ratio.items() if m != n]
        base = statistics.median(others) if others else 0.0
        if base > 0:
            out[n] = r / base
    return out


def lenient_systems(by_system: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """``{system: why}`` for each system the leniency rule (module docstring) finds:
    ``leniency_ratios`` at least ``LENIENCY_LIMIT``."""
    out = {}
    for n, x in leniency_ratios(by_system).items():
        if x >= LENIENCY_LIMIT:
            d = by_system[n]
            out[n] = (f"the judge says YES to {d['judge_yes_rate']:.0%} of its unlabelled pairs "
                      f"against a logged hit rate of {d['logged_hit_rate']:.0%}: {x:.1f}x "
                      f"the other systems' median ratio (limit {LENIENCY_LIMIT:g}x)")  # fmt: skip
    return out


def list_overlap(
    runs: Sequence[Any], own: Mapping[str, Sequence[str]], users: Sequence[str], k: int
) -> dict[str, float]:
    """Per run, the share of its top-k pairs (over ``users``) that the CF model's own top-k
    lists (``own``, ``cf_models.top_k_lists``) also hold."""
    out = {}
    for run in runs:
        hit = total = 0
        for u in users:
            top = run.rankings.get(u, [])[:k]
            mine = set(own.get(u, [])[:k])
            hit += sum(i in mine for i in top)
            total += len(top)
        out[run.name] = hit / total if total else 0.0
    return out


def judge_by_system(
    runs: Sequence[Any],
    logged: Mapping[str, Mapping[str, int]],
    sidecar: Mapping[tuple[str, str], Mapping[str, Any]],
    users: Sequence[str],
    k: int,
) -> dict[str, dict[str, Any]]:
    """Per system, over its top-k pairs of ``users``: the logged hit rate (positives among
    the pairs the log labels), and the judge's YES rate and mean sigma on the pairs the log
    does not label (``sidecar``: ``imputed.jsonl`` records by pair). A judge whose YES rate
    follows one system's sigma while the logged hit rates do not is lenient to it."""
    out = {}
    for run in runs:
        listed = labelled = pos = 0
        yes, sig, judged = 0, 0.0, 0
        for u in users:
            labels = logged.get(u, {})
            for i in run.rankings.get(u, [])[:k]:
                listed += 1
                if i in labels:
                    labelled += 1
                    pos += labels[i] > 0
                    continue
                rec = sidecar.get((u, i))
                if rec is None or rec.get("error"):
                    continue
                judged += 1
                yes += int(rec.get("label", 0))
                s = rec.get("sigma")
                sig += float(s) if isinstance(s, int | float) else 0.0
        out[run.name] = {
            "listed": listed,
            "logged": labelled,
            "logged_hit_rate": pos / labelled if labelled else None,
            "unlabelled_judged": judged,
            "judge_yes_rate": yes / judged if judged else None,
            "mean_sigma": sig / judged if judged else None,
        }
    return out


def related_systems(
    by_system: Mapping[str, Mapping[str, Any]],
    overlap: Mapping[str, float] | None = None,
) -> tuple[dict[str, str], dict[str, str]]:
    """``(refused, flagged)``, each ``{system: why}``, from what the judge did on each
    system's lists, whatever the run files are called or carry: a mean sigma on its
    unlabelled pairs of at least ``SIGMA_REFUSE`` (the judge's CF model ranks the system's
    items as its own top picks: a copy, a retrained twin, a run with a few items swapped) or
    a share of its top-k in the CF model's own top-k of at least ``OVERLAP_LIMIT`` is
    refused; a mean sigma of at least ``SIGMA_FLAG`` is flagged as a related model, with the
    overlap and the gap between its judge YES rate and the other systems' median."""
    overlap = overlap or {}
    refused, flagged = {}, {}
    for name, d in by_system.items():
        sigma, yes = d.get("mean_sigma"), d.get("judge_yes_rate")
        others = [x.get("judge_yes_rate") for n, x in by_system.items() if n != name]
        others = [x for x in others if x is not None]
        gap = ""
        if yes is not None and others:
            gap = (f"; judge YES rate {yes:.0%} against the other systems' median "
                   f"{statistics.median(others):.0%}")  # fmt: skip
        shared = (f"; {overlap[name]:.0%} of its top-k pairs are the judge's CF model's own "
                  "top-k" if name in overlap else "")  # fmt: skip
        if overlap.get(name, 0.0) >= OVERLAP_LIMIT or (sigma is not None and sigma >= SIGMA_REFUSE):
            refused[name] = (f"the judge's CF model scores its unlabelled pairs at mean sigma "
                             f"{sigma if sigma is not None else float('nan'):.2f} (refused from "
                             f"{SIGMA_REFUSE:g}, or a list overlap from {OVERLAP_LIMIT:.0%})"
                             f"{shared}{gap}: the run is the judge's CF model in all but "
                             "name")  # fmt: skip
        elif sigma is not None and sigma >= SIGMA_FLAG:
            flagged[name] = (f"a model related to the judge's CF model: mean sigma {sigma:.2f} on "
                             f"its unlabelled pairs (flagged from {SIGMA_FLAG:g}){shared}{gap}; "
                             "its imputed metric may be inflated: check it with gold labels "
                             "(--gold)")  # fmt: skip
    return refused, flagged


def _clustered_mean(values: Mapping[tuple[str, str], float]) -> tuple[float, float, int]:
    """The mean of per-pair ``values`` with its cluster-robust (by user, CR1) variance."""
    sums: dict[str, list[float]] = {}
    for (u, _), v in values.items():
        c = sums.setdefault(u, [0.0, 0.0])
        c[0] += v
        c[1] += 1
    n = sum(c[1] for c in sums.values())
    g = len(sums)
    if n == 0 or g < 2:
        return 0.0, float("inf"), g
    mean = sum(c[0] for c in sums.values()) / n
    var = g / (g - 1) * sum((c[0] - mean * c[1]) ** 2 for c in sums.values()) / n**2
    return mean, var, g


def gold_leniency(
    systems: Sequence[str],
    runs: Sequence[Any],
    users: Sequence[str],
    k: int,
    hard: Mapping[tuple[str, str], bool],
    gold: Mapping[tuple[str, str], int],
    z: float = 1.959964,
) -> dict[str, str]:
    """``{system: why}`` for each of ``systems`` (those ``related_systems`` flagged) whose
    gold labels show the judge's leniency: on its gold pairs the judge's excess of YES over
    the labels (``mean(h - y)``) exceeds that on the other systems' gold pairs, the 95 %
    interval of the gap (cluster-robust by user, the two groups taken as independent) above
    0. A related model whose lists the judge favours beyond what the labels say is circular
    in effect."""
    by_name = {r.name: r for r in runs}
    out = {}
    for name in systems:
        run = by_name.get(name)
        if run is None:
            continue
        mine = {(u, i) for u in users for i in run.rankings.get(u, [])[:k]}
        excess = {key: float(hard[key]) - y for key, y in gold.items() if key in hard}
        a = {key: v for key, v in excess.items() if key in mine}
        b = {key: v for key, v in excess.items() if key not in mine}
        (ma, va, ga), (mb, vb, gb) = _clustered_mean(a), _clustered_mean(b)
        if min(ga, gb) < 2:
            continue
        gap, half = ma - mb, z * (va + vb) ** 0.5
        if gap - half > 0:
            out[name] = (f"the gold labels show the judge's leniency: on {len(a)} gold pairs "
                         f"of its lists it says YES {ma:+.2f} beyond the labels, on the other "
                         f"systems' {len(b)} {mb:+.2f} (gap {gap:+.2f} [{gap - half:+.2f}, "
                         f"{gap + half:+.2f}])")  # fmt: skip
    return out
