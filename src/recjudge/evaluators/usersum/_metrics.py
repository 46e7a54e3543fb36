"""UserSumBench metrics and segmentation: pure functions (tested on hand cases).

QM, IFM and IDM after "UserSumBench: A Benchmark Framework for Evaluating User Summarization
Approaches" (Wang et al., 2024); ROUGE and BLEU as the reference-based comparison.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from recjudge._util import rng

LETTERS = ("A", "B", "C", "D", "E")
TASKS = ("t1_item", "t2_item_recent", "t3_category", "t4_category_recent")


# -- multiple choice --------------------------------------------------------------------------
def make_mcq(correct: str, pool: Sequence[str], seed: Any, wrong: int = 4) -> tuple[list[str], str]:
    """Options = ``correct`` plus ``wrong`` distinct random others from ``pool``, shuffled.

    Seeded by sha256 of ``seed`` (same on every machine and process). Returns (options, the
    correct letter). Raises ValueError when the pool has too few alternatives.
    """
    others = sorted({str(p) for p in pool} - {str(correct)})
    if len(others) < wrong:
        raise ValueError(
            f"need {wrong} wrong options besides {correct!r}, the pool has {len(others)}"
        )
    g = rng("usersum-mcq", seed)
    picks = [others[i] for i in g.choice(len(others), size=wrong, replace=False)]
    options = [str(correct), *picks]
    order = g.permutation(len(options))
    options = [options[i] for i in order]
    return options, LETTERS[options.index(str(correct))]


# -- metrics (pure) ---------------------------------------------------------------------------
def word_count(text: str) -> int:
    return len(text.split())


def summary_quality(correct: Sequence[bool], m: int = 3) -> int:
    """Q_s = 1 if at least ``m`` of the summary's tasks are answered correctly, else 0."""
    return int(sum(bool(c) for c in correct) >= m)


def usersum_metrics(
    summaries: Sequence[Mapping[str, Any]], word_limit: int, m: int = 3
) -> dict[str, float]:
    """QM, IFM and IDM over summaries (UserSumBench).

    Each summary record has ``text`` and ``correct`` (one bool per task).
    QM = mean_s Q_s with Q_s = 1[sum(correct) >= m]; IFM = share of summaries with at most
    ``word_limit`` words; IDM = mean_s (mean task accuracy_s / words_s), the accuracy bought
    per word (0 for an empty summary). Higher is better for all three.
    """
    if not summaries:
        return {"qm": 0.0, "ifm": 0.0, "idm": 0.0, "task_accuracy": 0.0}
    qs, within, dens, acc = [], [], [], []
    for s in summaries:
        c = [bool(x) for x in s["correct"]]
        words = word_count(s["text"])
        a = sum(c) / len(c) if c else 0.0
        qs.append(summary_quality(c, m))
        within.append(words <= word_limit)
        dens.append(a / words if words else 0.0)
        acc.append(a)
    return {
        "qm": float(np.mean(qs)),
        "ifm": float(np.mean(within)),
        "idm": float(np.mean(dens)),
        "task_accuracy": float(np.mean(acc)),
    }


_TOKEN = re.compile(r"[a-z0-9]+")


def _tokens(text: str) -> list[str]:
    return _TOKEN.findall(text.lower())


def _ngrams(tokens: Sequence[str], n: int) -> Counter:
    return Counter(tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1))


def rouge_n(candidate: str, reference: str, n: int = 2) -> float:
    """ROUGE-N F1 (Lin, 2004) on lower-cased alphanumeric tokens."""
    c, r = _ngrams(_tokens(candidate), n), _ngrams(_tokens(reference), n)
    overlap = sum((c & r).values())
    if not overlap:
        return 0.0
    p, rec = overlap / sum(c.values()), overlap / sum(r.values())
    return 2 * p * rec / (p + rec)


def _lcs(a: Sequence[str], b: Sequence[str]) -> int:
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b):
            cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1]


def rouge_l(candidate: str, reference: str) -> float:
    """ROUGE-L F1: longest common subsequence of tokens (Lin, 2004)."""
    c, r = _tokens(candidate), _tokens(reference)
    lcs = _lcs(c, r) if c and r else 0
    if not lcs:
        return 0.0
    p, rec = lcs / len(c), lcs / len(r)
    return 2 * p * rec / (p + rec)


def bleu(candidate: str, reference: str, max_n: int = 4) -> float:
    """Sentence BLEU-4 (Papineni et al., 2002) with add-one smoothing for n > 1 (Lin & Och,
    2004) and the brevity penalty."""
    c, r = _tokens(candidate), _tokens(reference)
    if not c or not r:
        return 0.0
    logs = []
    for n in range(1, max_n + 1):
        cn, rn = _ngrams(c, n), _ngrams(r, n)
        match, total = sum((cn & rn).values()), max(sum(cn.values()), 0)
        if n > 1:
            match, total = match + 1, total + 1
        if match == 0 or total == 0:
            return 0.0
        logs.append(math.log(match / total))
    bp = 1.0 if len(c) > len(r) else math.exp(1 - len(r) / len(c))
    return bp * math.exp(sum(logs) / max_n)


# -- segmentation -------------------------------------------------------------------------------
def segment(n: int, min_size: int, max_segments: int | None = None) -> list[tuple[int, int]]:
    """Count-based segments (our former rule, kept as ``segmentation="count"``): split ``n``
    chronological activities into contiguous ``[start, end)`` segments of at least
    ``min_size`` each (one segment if ``n < 2 * min_size``), sizes differing by at most one,
    at most ``max_segments`` of them."""
    if n <= 0:
        return []
    k = max(1, n // min_size)
    if max_segments:
        k = min(k, max_segments)
    bounds = np.linspace(0, n, k + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def time_segments(
    timestamps: Sequence[float], min_count: int, max_segments: int | None = None
) -> list[tuple[int, int]]:
    """Time-based segments with a minimum activity count (UserSumBench's time hierarchy,
    Alg. 1, as we read it): the span from the first to the last activity is cut into
    ``max_segments`` windows of equal duration; a window with fewer than ``min_count``
    activities is merged into the next one (the last into the one before), until every
    segment has at least ``min_count`` (or only one segment is left).

    Args:
        timestamps: activity times in chronological order (any unit).
        min_count: fewest activities per segment.
        max_segments: windows before merging (``None``: as many as ``n // min_count``).

    Returns:
        contiguous ``[start, end)`` index ranges covering every activity, oldest first.
    """
    n = len(timestamps)
    if n == 0:
        return []
    t = np.asarray(timestamps, dtype=float)
    if np.any(np.diff(t) < 0):
        raise ValueError("timestamps must be in chronological order")
    k = max(1, n // max(min_count, 1))
    if max_segments:
        k = min(k, max_segments)
    edges = np.linspace(t[0], t[-1], k + 1)[1:-1]
    cuts = [0, *np.searchsorted(t, edges, side="right").tolist(), n]
    segs = [[a, b] for a, b in zip(cuts[:-1], cuts[1:], strict=True)]
    i = 0
    while len(segs) > 1 and i < len(segs):
        if segs[i][1] - segs[i][0] >= min_count:
            i += 1
            continue
        if i + 1 < len(segs):  # merge into the next window
            segs[i + 1][0] = segs[i][0]
        else:  # the last window: merge into the previous
            segs[i - 1][1] = segs[i][1]
        del segs[i]
        i = max(i - 1, 0)
    return [(int(a), int(b)) for a, b in segs]
