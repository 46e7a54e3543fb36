"""Shared request builder for the vLLM parity tests (real ML-1M rows, SmolLM2)."""

from __future__ import annotations

import hashlib

from recjudge.bench._brief import candidate_requests
from recjudge.data import load_dataset, sample_users, timeline_split


def parity_requests(n_users: int = 5, per_user: int = 10, history: int = 30, seed: int = 0):
    """``n_users * per_user`` judge requests: each user's next future items and never-rated
    items, most recent ``history`` past items; sigma spread over [-1, 1] by a hash so both
    signs and all strengths are exercised."""
    ds = load_dataset("ml-1m")
    past, future = timeline_split(ds.interactions, fraction=0.2)
    users = sample_users(sorted(past["user_id"].astype(str).unique()), n_users, seed=seed)
    all_items = ds.items["item_id"].astype(str).tolist()
    past_by = {u: g for u, g in past.groupby("user_id", observed=True) if u in set(users)}
    cands = {}
    for u in users:
        seen = set(ds.history(u)["item_id"].astype(str))
        fut = future[future["user_id"] == u]["item_id"].astype(str).tolist()[: per_user // 2]
        h = int(hashlib.sha256(f"{seed}:{u}".encode()).hexdigest()[:8], 16)
        unseen = [all_items[(h + 97 * k) % len(all_items)] for k in range(4 * per_user)]
        unseen = [i for i in unseen if i not in seen][: per_user - len(fut)]
        cands[u] = fut + unseen
    reqs = candidate_requests(ds, past_by, cands, history)
    for r in reqs:
        h = hashlib.sha256(f"{r.user_id}:{r.candidate_id}".encode()).digest()
        r.sigma = round(int.from_bytes(h[:4], "big") / 2**31 - 1.0, 4)
    return reqs
