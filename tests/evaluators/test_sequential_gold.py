"""Issue 89 item 5's sequential mode: a gold file labelled from the top, whole users, read at
any point as the users design at the users labelled so far, and a stopping rule whose
interval at the stop still covers."""

from __future__ import annotations

import json

import numpy as np
import pytest

from recjudge.data import DataError
from recjudge.evaluators import RecRun, RunCheck, listed_pairs, sample_gold
from recjudge.evaluators.offline._gold import (
    active_score,
    order_record,
    priority_inclusion,
    read_gold,
    write_gold,
)
from recjudge.evaluators.offline._jobs import (
    MIN_SEQUENTIAL,
    estimator_lines,
    sequential_step,
    sequential_stop,
)
from recjudge.evaluators.offline._ppi import clustered_ppi_mean, ppi_user_totals

LISTS = {f"u{u}": [f"i{(u * 3 + r) % 40}" for r in range(4)] for u in range(12)}
RUN = RecRun("a", "a.jsonl", LISTS, {}, RunCheck())
USERS = sorted(LISTS)


def _sequential_file(tmp_path):
    rows = sample_gold([RUN], USERS, 4, 8, design="users", seed=3, sequential=True)
    order = list(dict.fromkeys(r["user_id"] for r in rows))
    path = tmp_path / "gold.csv"
    write_gold(rows, path, {"design": "users", "seed": 3, "k": 4, "n": 8,
                            "runs": {"a": "a.jsonl"}, "sequential": True,
                            "order": order})  # fmt: skip
    return path, order


def _label(path, users, skip_rows=()):
    """Label every row of ``users`` (1 on even items), except the rows in ``skip_rows``."""
    lines = path.read_text().splitlines()
    out = [lines[0]]
    for n, line in enumerate(lines[1:], 1):
        u, i, rest = line.split(",", 2)
        if u in users and n not in skip_rows:
            rest = str(int(i[1:]) % 2) + rest
        out.append(",".join([u, i, rest]))
    path.write_text("\n".join(out) + "\n")


def test_a_sequential_sample_holds_every_user_in_a_random_order():
    rows = sample_gold([RUN], USERS, 4, 8, design="users", seed=3, sequential=True)
    order = list(dict.fromkeys(r["user_id"] for r in rows))
    assert sorted(order) == USERS and order != USERS  # all of them, shuffled
    assert [r["order"] for r in rows] == [order.index(r["user_id"]) + 1 for r in rows]
    assert {(r["user_id"], r["item_id"]) for r in rows} == set(listed_pairs([RUN], USERS, 4))
    assert all(r["inclusion_prob"] is None for r in rows)  # known at the stop


def test_a_labelled_prefix_reads_as_the_users_design_at_its_size(tmp_path):
    path, order = _sequential_file(tmp_path)
    _label(path, set(order[:5]))
    gold = read_gold(path, USERS, set(listed_pairs([RUN], USERS, 4)), ["a"], 4)
    assert gold.sequential == (5, 12) and gold.design == "users"
    assert {u for u, _ in gold.labels} == set(order[:5]) and len(gold) == 20
    assert set(gold.inclusion.values()) == {5 / 12}


def test_a_skipped_user_or_a_partly_labelled_one_is_refused_by_row(tmp_path):
    listed = set(listed_pairs([RUN], USERS, 4))
    path, order = _sequential_file(tmp_path)
    _label(path, {order[0], order[2]})  # the second user skipped
    with pytest.raises(DataError, match=f"user '{order[1]}' .order 2. is not") as e:
        read_gold(path, USERS, listed, ["a"], 4)
    assert e.value.row == 9  # the skipped-over user's first row (4 rows per user)
    path, order = _sequential_file(tmp_path)
    _label(path, {order[0], order[1]}, skip_rows={6})  # one row of the second user
    with pytest.raises(DataError, match=f"user '{order[1]}' is partly labelled") as e:
        read_gold(path, USERS, listed, ["a"], 4)
    assert e.value.row == 6
    record = json.loads((tmp_path / "gold.csv.design.json").read_text())
    (tmp_path / "gold.csv.design.json").write_text(json.dumps({**record, "order": []}))
    with pytest.raises(DataError, match="needs the users' order"):
        read_gold(path, USERS, listed, ["a"], 4)


def test_a_sequential_pair_sample_reads_its_labelled_prefix(tmp_path):
    """The uniform design's sequential file: every listed pair in a random order; the first
    m labelled pairs read as the uniform design at m (pi = m / S); a skipped pair refused."""
    rows = sample_gold([RUN], USERS, 4, 8, design="uniform", seed=3, sequential=True)
    frame = listed_pairs([RUN], USERS, 4)
    order = [(r["user_id"], r["item_id"]) for r in rows]
    assert sorted(order) == sorted(frame) and order != frame
    assert [r["order"] for r in rows] == list(range(1, len(frame) + 1))
    path = tmp_path / "gold.csv"
    write_gold(rows, path, {"design": "uniform", "seed": 3, "k": 4, "n": 8,
                            "runs": {"a": "a.jsonl"}, "sequential": True,
                            "order": [list(x) for x in order]})  # fmt: skip
    text = path.read_text().splitlines()
    labelled = [text[0]] + [line.replace(",,", ",1,", 1) for line in text[1:8]] + text[8:]
    path.write_text("\n".join(labelled) + "\n")
    gold = read_gold(path, USERS, set(frame), ["a"], 4)
    assert gold.sequential == (7, len(frame)) and gold.design == "uniform"
    assert set(gold.labels) == set(order[:7]) and set(gold.inclusion.values()) == {7 / 48}
    skipped = [text[0], *labelled[1:4], text[4], *labelled[5:8], *text[8:]]  # order 4 skipped
    path.write_text("\n".join(skipped) + "\n")
    with pytest.raises(DataError, match=r"pair .* \(order 4\) is not") as e:
        read_gold(path, USERS, set(frame), ["a"], 4)
    assert e.value.row == 7  # the last labelled pair beyond the gap


def test_the_stop_waits_for_every_system_and_the_minimum():
    narrow, wide = (0.5, 0.47, 0.53), (0.5, 0.3, 0.7)
    assert sequential_stop({"a": narrow, "b": narrow}, 40, 100)["stop"]
    assert not sequential_stop({"a": narrow, "b": narrow}, MIN_SEQUENTIAL["users"] - 1, 100)["stop"]
    s = sequential_stop({"a": narrow, "b": wide}, 40, 100)
    # half-width 0.2 against a target of 0.05: 16 times the users
    assert not s["stop"] and s["target_users"] == 640 and s["widest"] == "b"
    s = sequential_stop({"a": narrow, "b": None}, 40, 100)  # b's interval refused
    assert not s["stop"] and s["target_users"] == 41
    got = {"systems": {"a": {"p@5": {"ppi": {"value": 0.5, "ci": [0.3, 0.7]}}}}}
    step = sequential_step(got, "p@5", 40, 100, "gold.csv")
    assert step["target_users"] > 100 and "more than the file's 100" in step["text"]
    step = sequential_step(got, "p@5", 100, 100, "gold.csv")
    assert not step["stop"] and "every one is labelled" in step["text"]
    step = sequential_step(got, "p@5", 40, 1000, "gold.csv")
    assert "go on to order 640" in step["text"] and "gold.csv" in step["text"]
    est = {"systems": {}, "propensity": "none", "clipped": 0, "calibration": "none",
           "gold": "gold.csv", "next_step": step}  # fmt: skip
    assert f"- next step: {step['text']}" in estimator_lines(est)


def test_the_interval_at_the_stop_covers():
    """200 labelling campaigns on a finite population of 300 users (10 pairs each, relevance
    clustered by user, a judge that is informative but biased): users labelled in a random
    order, 5 at a time, the clustered PPI interval computed after each batch and the
    campaign stopped by ``sequential_stop``. The interval at the stop covers the population's
    mean in >= 90 % of campaigns (nominal 95 %), and the stop comes early in most (so the
    rule is exercised, not the census)."""
    g = np.random.default_rng(11)
    n_users, per = 300, 10
    clusters = np.repeat(np.arange(n_users), per)
    covered, stops = 0, []
    for _ in range(200):
        rate = g.beta(4, 4, size=n_users)
        y = (g.random((n_users, per)) < rate[:, None]).astype(float)
        proxy = np.clip(rate[:, None] + 0.1 + g.normal(0, 0.1, (n_users, per)), 0, 1)
        order = g.permutation(n_users)
        for m in range(5, n_users - 1, 5):
            seen = np.full((n_users, per), np.nan)
            seen[order[:m]] = y[order[:m]]
            try:
                e = clustered_ppi_mean(seen.ravel(), proxy.ravel(), clusters)
                iv = (e["value"], e["lo"], e["hi"])
            except ValueError:  # one class among the labelled, or too few clusters
                iv = None
            if sequential_stop({"a": iv}, m, n_users)["stop"]:
                break
        stops.append(m)
        covered += iv is not None and iv[1] <= y.mean() <= iv[2]
    assert covered / 200 >= 0.90
    assert np.median(stops) < n_users / 2


def _pair_campaigns(design, seed=11, campaigns=200):
    """Simulated labelling campaigns over pairs (300 users x 10 pairs, clustered relevance,
    a biased informative proxy), 25 pairs a look, the design-based user-total PPI with
    ``design(g, proxy)``'s ``pi_at(m)`` (per pair, 0 where unlabelled), stopped by
    ``sequential_stop``: (coverage of the interval at the stop, the stops, the pairs)."""
    g = np.random.default_rng(seed)
    n_users, per = 300, 10
    pairs = n_users * per
    covered, stops = 0, []
    for _ in range(campaigns):
        rate = g.beta(4, 4, size=n_users)
        y = (g.random((n_users, per)) < rate[:, None]).astype(float)
        proxy = np.clip(rate[:, None] + 0.1 + g.normal(0, 0.1, (n_users, per)), 0, 1)
        pi_at = design(g, proxy.ravel())
        for m in range(25, pairs - 1, 25):
            pi = pi_at(m)
            w = np.divide(1.0, per * pi, out=np.zeros(pairs), where=pi > 0).reshape(n_users, per)
            e = ppi_user_totals(proxy.sum(1) / per, (y * w).sum(1), (proxy * w).sum(1))
            iv = (e["value"], e["lo"], e["hi"])
            if sequential_stop({"a": iv}, m, pairs, "pairs")["stop"]:
                break
        stops.append(m)
        covered += iv[1] <= y.mean() <= iv[2]
    return covered / campaigns, stops, pairs


def _prefix(order, values):
    """``pi_at`` for a prefix of ``order`` whose labelled pairs get ``values(m, labelled)``."""

    def pi_at(m):
        pi = np.zeros(len(order))
        pi[order[:m]] = values(m, order[:m])
        return pi

    return pi_at


def test_the_pair_designs_interval_at_the_stop_covers():
    """The same campaigns labelling pairs (the uniform design, 25 at a time, the
    design-based user-total PPI with pi = m / S): the interval at the stop covers in >= 90 %
    of campaigns, and the stop comes early in most."""

    def uniform(g, proxy):
        return _prefix(g.permutation(len(proxy)), lambda m, _: m / len(proxy))

    coverage, stops, pairs = _pair_campaigns(uniform)
    assert coverage >= 0.90
    assert np.median(stops) < pairs / 2


RUN_B = RecRun("b", "b.jsonl", {u: list(reversed(items)) + ["i41"] for u, items in LISTS.items()},
               {}, RunCheck())  # fmt: skip
JUDGED = {(u, f"i{j}"): (j / 41, j > 20) for u in USERS for j in range(42)}


def _stratified_rows():
    return sample_gold([RUN, RUN_B], USERS, 5, 8, design="stratified", seed=3,
                       judged=JUDGED, sequential=True)  # fmt: skip


def test_the_stratified_order_takes_the_strata_in_turn():
    """Every listed pair once; any prefix holds the equal allocation (counts per stratum
    differ by at most one among the strata not yet exhausted), each stratum's pairs in a
    random order, and at m = per x strata the non-sequential design's allocation."""
    rows = _stratified_rows()
    frame = listed_pairs([RUN, RUN_B], USERS, 5)
    assert sorted((r["user_id"], r["item_id"]) for r in rows) == sorted(frame)
    assert [r["order"] for r in rows] == list(range(1, len(frame) + 1))
    size: dict[str, int] = {}
    for r in rows:
        size[r["stratum"]] = size.get(r["stratum"], 0) + 1
    assert len(size) > 2
    for m in range(1, len(rows) + 1):
        got: dict[str, int] = {}
        for r in rows[:m]:
            got[r["stratum"]] = got.get(r["stratum"], 0) + 1
        open_ = [got.get(h, 0) for h in size if got.get(h, 0) < size[h]]
        assert not open_ or max(open_) - min(open_) <= 1
    fixed = sample_gold([RUN, RUN_B], USERS, 5, 2 * len(size), design="stratified", seed=3,
                        judged=JUDGED)  # fmt: skip
    alloc = {h: sum(r["stratum"] == h for r in rows[: 2 * len(size)]) for h in size}
    assert alloc == {h: sum(r["stratum"] == h for r in fixed) for h in size}


def _write_pairs(tmp_path, rows, design):
    """A sequential pair sample of runs a and b at k = 5 as `gold sample` writes it: the
    file and its lines."""
    path = tmp_path / "gold.csv"
    write_gold(rows, path, {"design": design, "seed": 3, "k": 5, "n": 8,
                            "runs": {"a": "a.jsonl", "b": "b.jsonl"}, "sequential": True,
                            "order": order_record(design, rows)})  # fmt: skip
    return path, path.read_text().splitlines()


def test_a_stratified_prefix_reads_with_each_stratums_share(tmp_path):
    """The first m labelled pairs read as stratified sampling at m: pi = m_h / N_h per
    stratum; fewer labelled pairs than strata is refused with the order to label down to."""
    rows = _stratified_rows()
    path, text = _write_pairs(tmp_path, rows, "stratified")
    listed = set(listed_pairs([RUN, RUN_B], USERS, 5))
    strata = sorted({r["stratum"] for r in rows})
    m = len(strata) + 5
    path.write_text("\n".join([text[0], *(line.replace(",,", ",0,", 1) for line in text[1:m + 1]),
                               *text[m + 1:]]) + "\n")  # fmt: skip
    gold = read_gold(path, USERS, listed, ["a", "b"], 5)
    assert gold.design == "stratified" and gold.unit == "pairs"
    assert gold.sequential == (m, len(rows)) and len(gold) == m
    for r in rows[:m]:
        n_h = sum(x["stratum"] == r["stratum"] for x in rows)
        m_h = sum(x["stratum"] == r["stratum"] for x in rows[:m])
        assert gold.inclusion[(r["user_id"], r["item_id"])] == pytest.approx(m_h / n_h)
    few = len(strata) - 1
    path.write_text("\n".join([text[0], *(line.replace(",,", ",1,", 1) for line in text[1:few + 1]),
                               *text[few + 1:]]) + "\n")  # fmt: skip
    with pytest.raises(DataError, match=f"down to order {len(strata)}"):
        read_gold(path, USERS, listed, ["a", "b"], 5)


def test_the_stratified_designs_interval_at_the_stop_covers():
    """Campaigns labelling pairs in the stratified order (strata: the judge's quartile),
    25 at a time, the design-based user-total PPI with pi = m_h / N_h: the interval at the
    stop covers in >= 90 % of 200 campaigns, and the stop comes early in most."""

    def stratified(g, proxy):
        stratum = np.searchsorted(np.quantile(proxy, [0.25, 0.5, 0.75]), proxy, side="right")
        queues = [g.permutation(np.flatnonzero(stratum == h)) for h in range(4)]
        order = np.array([q[d] for d in range(max(map(len, queues)))
                          for q in queues if d < len(q)])  # fmt: skip
        sizes = np.bincount(stratum, minlength=4)
        return _prefix(order, lambda m, lab: (np.bincount(stratum[lab], minlength=4)
                                              / sizes)[stratum[lab]])  # fmt: skip

    coverage, stops, pairs = _pair_campaigns(stratified)
    assert coverage >= 0.90
    assert np.median(stops) < pairs / 2


def _active_rows(seed=3):
    return sample_gold([RUN, RUN_B], USERS, 5, 8, design="active", seed=seed, judged=JUDGED,
                       sequential=True)  # fmt: skip


def test_the_active_order_is_priority_sampling_over_every_listed_pair():
    """Every listed pair once, keys ascending, each pair's weight its active score, and pairs
    the judge is unsure of (p near 0.5) come earlier on average than those it is sure of."""
    rows = _active_rows()
    frame = listed_pairs([RUN, RUN_B], USERS, 5)
    assert sorted((r["user_id"], r["item_id"]) for r in rows) == sorted(frame)
    assert [r["order"] for r in rows] == list(range(1, len(frame) + 1))
    keys = [r["priority"] for r in rows]
    assert keys == sorted(keys) and min(keys) > 0
    score = dict(zip(frame, active_score([JUDGED[pair][0] for pair in frame]), strict=True))
    assert all(r["weight"] == pytest.approx(score[(r["user_id"], r["item_id"])]) for r in rows)
    unsure = [n for n, r in enumerate(rows) if r["weight"] > 1]
    sure = [n for n, r in enumerate(rows) if r["weight"] < 1]
    ranks = [np.mean(unsure), np.mean(sure)]
    for seed in range(4, 24):  # over many orders, the unsure pairs' mean rank is earlier
        r2 = _active_rows(seed)
        ranks[0] += np.mean([n for n, r in enumerate(r2) if r["weight"] > 1])
        ranks[1] += np.mean([n for n, r in enumerate(r2) if r["weight"] < 1])
    assert ranks[0] < ranks[1]


def test_an_active_prefix_reads_with_priority_inclusion(tmp_path):
    """The first m labelled pairs: pi = min(1, weight * the (m+1)-th pair's key); all of
    them labelled: pi = 1; an order whose keys are not ascending is refused."""
    rows = _active_rows()
    path, text = _write_pairs(tmp_path, rows, "active")
    listed = set(listed_pairs([RUN, RUN_B], USERS, 5))
    m = 9
    path.write_text("\n".join([text[0], *(line.replace(",,", ",0,", 1) for line in text[1:m + 1]),
                               *text[m + 1:]]) + "\n")  # fmt: skip
    gold = read_gold(path, USERS, listed, ["a", "b"], 5)
    assert gold.design == "active" and gold.unit == "pairs" and gold.sequential == (m, len(rows))
    nxt = rows[m]["priority"]
    for r in rows[:m]:
        want = min(1.0, r["weight"] * nxt)
        assert gold.inclusion[(r["user_id"], r["item_id"])] == pytest.approx(want)
    assert priority_inclusion([0.5, 2.0], [0.1, 0.3], 2).tolist() == [1.0, 1.0]
    assert priority_inclusion([0.5, 2.0, 1.0], [0.1, 0.3, 0.8], 2).tolist() == [0.4, 1.0]
    record = json.loads((tmp_path / "gold.csv.design.json").read_text())
    record["order"][0][3], record["order"][1][3] = record["order"][1][3], record["order"][0][3]
    record["order"][0][3] += 1.0  # the first key now above the second
    (tmp_path / "gold.csv.design.json").write_text(json.dumps(record))
    with pytest.raises(DataError, match="priorities ascending"):
        read_gold(path, USERS, listed, ["a", "b"], 5)


def test_priority_sampling_weights_are_unbiased_at_any_prefix():
    """Horvitz-Thompson with pi = min(1, lambda_i xi_(m+1)) over 20,000 orders: the mean
    estimate of a total equals the total within 4 Monte-Carlo standard errors, at a small
    and a large prefix (Duffield, Lund and Thorup's theorem, which the design rests on)."""
    g = np.random.default_rng(5)
    n = 60
    y = (g.random(n) < 0.3).astype(float) + g.random(n)
    lam = active_score(g.random(n))
    for m in (5, 40):
        est = np.empty(20000)
        for t in range(len(est)):
            xi = (1.0 - g.random(n)) / lam
            order = np.argsort(xi)
            pi = priority_inclusion(lam[order], xi[order], m)
            est[t] = (y[order[:m]] / pi).sum()
        assert abs(est.mean() - y.sum()) < 4 * est.std() / np.sqrt(len(est))


def test_the_active_designs_interval_at_the_stop_covers():
    """Campaigns labelling pairs in priority sampling's order (weights: the active score of
    a noisy judge), 25 at a time, the design-based user-total PPI with priority inclusion:
    the interval at the stop covers in >= 90 % of 200 campaigns, and the stop comes early."""

    def active(g, proxy):
        lam = active_score(proxy)
        xi = (1.0 - g.random(len(proxy))) / lam
        order = np.argsort(xi)
        return _prefix(order, lambda m, _: priority_inclusion(lam[order], xi[order], m))

    coverage, stops, pairs = _pair_campaigns(active)
    assert coverage >= 0.90
    assert np.median(stops) < pairs / 2
