"""A synthetic world with a known truth for the gold-label estimators' tests: users whose
relevance shares a taste (labels cluster by user), three systems of different quality, a
judge that tracks relevance in part; and a gold sample drawn by ``gold sample``'s code."""

from __future__ import annotations

import numpy as np

from recjudge.evaluators import GoldSample, RecRun, RunCheck, sample_gold


def world(seed: int, n_users: int = 300, k: int = 10, items: int = 400, base: float = -2.4):
    """``(runs, users, relevance per pair, judged (p, False) per pair, true precision@k per
    system)``; ``base`` is the logit of relevance before taste, quality and system effect."""
    g = np.random.default_rng(seed)
    taste, quality = g.normal(0, 1, n_users), g.normal(0, 1, items)
    runs, rel, judged = [], {}, {}
    for s, effect in enumerate((-0.3, 0.0, 0.4)):
        lists = {}
        for u in range(n_users):
            pool = g.choice(items, k, replace=False)
            lists[str(u)] = [str(i) for i in pool]
            for i in pool:
                key = (str(u), str(i))
                if key not in rel:
                    z = base + taste[u] + 0.7 * quality[i] + effect
                    rel[key] = int(g.random() < 1 / (1 + np.exp(-z)))
                    judged[key] = (float(1 / (1 + np.exp(-(0.6 * z + g.normal())))), False)
        runs.append(RecRun(f"s{s}", "", lists, {}, RunCheck()))
    users = [str(u) for u in range(n_users)]
    truth = {r.name: float(np.mean([np.mean([rel[(u, i)] for i in r.rankings[u][:k]])
                                    for u in users])) for r in runs}  # fmt: skip
    return runs, users, rel, judged, truth


def gold(runs, users, rel, n, design, seed):
    """A gold sample of ``n`` pairs under ``design``, labelled with the truth."""
    rows = sample_gold(runs, users, 10, n, design=design, seed=seed)
    keys = [(r["user_id"], r["item_id"]) for r in rows]
    return GoldSample({key: rel[key] for key in keys},
                      {key: float(r["inclusion_prob"]) for key, r in zip(keys, rows,
                                                                         strict=True)},
                      design=design)  # fmt: skip
