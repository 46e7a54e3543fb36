"""BRIEF experiment statistics on hand-computed cases, and a tiny real run."""

from __future__ import annotations

import json
import math
import sqlite3
from types import SimpleNamespace
from types import SimpleNamespace as NS

import numpy as np
import pytest

from recjudge.bench import (
    AugmentBenchConfig,
    BriefExperimentConfig,
    OfflineConfig,
    _brief,
    auc,
    auc_ci,
    bench_brief_augment,
    bench_brief_beta,
    bench_brief_offline,
    bench_brief_ratings,
    gap,
    level_ci,
    level_correlations,
    level_table,
    lift,
    ranking_metrics,
    setting_difference,
    spearman_ci,
)
from recjudge.bench._augment import LABELLING, METHODS, choose
from recjudge.bench._brief import _analyse, beta_optimum, paired_against_brief, rating_level
from recjudge.bench._judging import judges_for
from recjudge.bench._offline import (
    _sasrec_note,
    exposure_mask,
    seed_interval,
    trained_system,
    untrained_system,
)
from recjudge.bench._vllm_worker import request_from_dict, request_to_dict
from recjudge.cf_models import MODELS
from recjudge.data import load_dataset, timeline_split
from recjudge.evaluators import read_qrels
from recjudge.reward import Judgment, ResultsStore, judge_per_user, request_for


def test_level_table_and_correlations_by_hand():
    levels = [1, 1, 2, 2, 3, 3, 4, 4, 5, 5]
    positive = [0, 0, 0, 1, 1, 0, 1, 1, 1, 1]
    t = level_table(levels, positive)
    assert t == {1: 0.0, 2: 50.0, 3: 50.0, 4: 100.0, 5: 100.0}
    c = level_correlations(t)
    # ranks of y: 1, 2.5, 2.5, 4.5, 4.5 against 1..5 -> rho = 0.9487 (hand-computed)
    assert c["spearman"] == pytest.approx(0.9486832980505138)
    assert c["kendall"] == pytest.approx(0.8944271909999159)
    assert level_correlations({1: 50.0, 2: 50.0, 3: 50.0}) == {"spearman": None, "kendall": None}


def test_auc_by_hand_and_ties():
    assert auc([0.9, 0.8], [0.1, 0.2]) == 1.0
    assert auc([0.1], [0.9]) == 0.0
    assert auc([0.5, 0.7], [0.5, 0.1]) == pytest.approx((0.5 + 1 + 1 + 1) / 4)
    assert auc([], [0.1]) is None
    ci = auc_ci([0.9, 0.8, 0.7], [0.1, 0.75, 0.2], 200, 0)
    assert ci["lo"] <= ci["auc"] <= ci["hi"]


def test_spearman_ci_contains_estimate_and_is_seeded():
    g = np.random.default_rng(0)
    x = np.arange(40.0)
    y = x + g.normal(0, 10, 40)
    a = spearman_ci(x, y, 300, "s")
    assert a["lo"] <= a["rho"] <= a["hi"] and a["n"] == 40
    assert spearman_ci(x, y, 300, "s") == a
    assert spearman_ci([1, 1, 1], [1, 2, 3], 10, 0)["rho"] is None


def test_rating_levels():
    assert [rating_level(r, 5) for r in (1, 3, 5)] == [1, 3, 5]
    assert [rating_level(r, 10) for r in (1, 2, 3, 9, 10)] == [1, 1, 2, 5, 5]


def test_config_round_trip():
    cfg = BriefExperimentConfig(model="m", users=3, betas=(0, 10), sigma_source="all")
    assert BriefExperimentConfig.model_validate_json(cfg.model_dump_json()) == cfg
    with pytest.raises(ValueError):
        BriefExperimentConfig(sigma_source="both")

    off = OfflineConfig(model="m", logging_seeds=(0, 1, 2), judges=("brief",))
    assert OfflineConfig.model_validate_json(off.model_dump_json()) == off
    assert off.log_seeds() == (0, 1, 2) and OfflineConfig(seed=4).log_seeds() == (4,)
    with pytest.raises(ValueError):
        OfflineConfig(logging_seeds=())


def test_the_judge_is_loaded_in_the_configs_dtype(smollm32):
    cfg = BriefExperimentConfig(model="smollm2-135m", dtype="float32")
    assert BriefExperimentConfig.model_validate_json(cfg.model_dump_json()) == cfg
    llm = cfg.judge_llm(cfg.model)
    assert llm is smollm32 and llm.config.resolved_dtype() == "float32"
    with pytest.raises(ValueError):
        BriefExperimentConfig(dtype="float64")


def test_paper_sampling_reaches_every_judge_and_the_level_table(smollm):
    cfg = BriefExperimentConfig(model="smollm2-135m", sampling="paper", samples=4, bootstrap=0)
    judge = judges_for(cfg, smollm, None, ["no-behavior"])["no-behavior"]
    s = judge.config.sampling
    assert (s.do_sample, s.temperature, s.top_p, s.top_k) == (True, 0.7, 0.8, 20)
    assert judge.config.samples == 4
    greedy = judges_for(BriefExperimentConfig(model="smollm2-135m"), smollm, None, ["zero-shot"])
    assert not greedy["zero-shot"].config.sampling.do_sample
    # % positive is over samples: a pair with 1 YES in 4 samples (majority NO) counts 25 %.
    reqs = [SimpleNamespace(meta={"kind": "rating", "level": lv, "rating": lv}) for lv in (1, 5)]
    js = [
        SimpleNamespace(is_relevant=False, p_yes=0.25, log_odds=-1.1),
        SimpleNamespace(is_relevant=True, p_yes=1.0, log_odds=30.0),
    ]
    sampled = _analyse(reqs, {"m": js}, cfg)["m"]["pct_positive_by_level"]
    assert sampled == {1: 25.0, 5: 100.0}
    read_out = _analyse(reqs, {"m": js}, cfg.model_copy(update={"sampling": "greedy"}))
    assert read_out["m"]["pct_positive_by_level"] == {1: 0.0, 5: 100.0}
    assert "the paper's sampling" in cfg.sampling_note()
    assert "deviation" in BriefExperimentConfig().sampling_note()


def test_greedy_rank_statistics_order_saturated_p_yes_by_log_odds():
    """Under a strong bias p_yes is exactly 1.0 for positives and negatives alike; the AUC and
    the pair Spearman must still see the judge's order (its log-odds), not a tie."""

    def j(p_sem: float, delta: float) -> Judgment:
        p_no = 1.0 / (1.0 + math.exp(math.log(p_sem / (1 - p_sem)) + 2 * delta))
        return Judgment("u", "i", "brief", True, ["t"], 1.0 - p_no, p_sem, 0.9, delta, 0.5, "")

    reqs = [SimpleNamespace(meta={"kind": "relevance", "label": lab}) for lab in (1, 1, 0, 0)]
    reqs += [SimpleNamespace(meta={"kind": "rating", "level": r, "rating": r}) for r in (1, 3, 5)]
    js = [j(0.9, 30.0), j(0.8, 29.0), j(0.3, 25.0), j(0.2, 26.0)]
    js += [j(0.2, 25.0), j(0.5, 26.0), j(0.9, 27.0)]
    assert {x.p_yes for x in js} == {1.0}  # p_yes alone: every pair tied
    cfg = BriefExperimentConfig(bootstrap=0)
    got = _analyse(reqs, {"m": js}, cfg)["m"]
    assert got["relevance_auc"]["auc"] == pytest.approx(1.0)
    assert got["pair_spearman"]["rho"] == pytest.approx(1.0)


@pytest.mark.slow
def test_brief_beta_tiny_real_run(smollm, tmp_path):
    cfg = BriefExperimentConfig(model="smollm2-135m", users=2, betas=(0, 40), bootstrap=20)
    r = bench_brief_beta(cfg, tmp_path, llm=smollm, progress=False)
    b0, b40 = r["betas"]["beta=0"], r["betas"]["beta=40"]
    assert b0["pct_positive_by_level"].keys() == b40["pct_positive_by_level"].keys()
    assert (tmp_path / "beta.png").stat().st_size > 1000
    saved = json.loads((tmp_path / "results.json").read_text())
    assert set(saved["betas"]) == {"beta=0", "beta=40"}
    assert saved["optimum"]["relevance_auc"]["beta"] in (0.0, 40.0, None)
    assert "**Optimum**" in (tmp_path / "report.md").read_text()


def test_ranking_metrics_match_ranx():
    from ranx import Qrels, Run
    from ranx import evaluate as rx

    g = np.random.default_rng(1)
    qrels, run, ours = {}, {}, []
    for q in range(25):
        relevant = {f"i{j}" for j in g.choice(60, size=int(g.integers(1, 12)), replace=False)}
        ranked = [f"i{j}" for j in g.permutation(60)[:20]]
        qrels[f"q{q}"] = dict.fromkeys(relevant, 1)
        run[f"q{q}"] = {item: 20.0 - r for r, item in enumerate(ranked)}
        ours.append(ranking_metrics([int(i in relevant) for i in ranked], len(relevant)))
    names = [
        "precision@10",
        "hit_rate@10",
        "ndcg@10",
        "map@10",
        "precision@20",
        "ndcg@20",
        "map@20",
        "mrr",
        "recall@10",
        "recall@20",
    ]
    theirs = rx(Qrels(qrels), Run(run), names)
    mine = {
        "precision@10": "p@10",
        "hit_rate@10": "hit_rate@10",
        "ndcg@10": "ndcg@10",
        "map@10": "map@10",
        "precision@20": "p@20",
        "ndcg@20": "ndcg@20",
        "map@20": "map@20",
        "mrr": "mrr",
        "recall@10": "recall@10",
        "recall@20": "recall@20",
    }
    for rx_name, key in mine.items():
        assert np.mean([o[key] for o in ours]) == pytest.approx(theirs[rx_name], abs=1e-9), rx_name


def test_lift_and_gap_by_hand():
    assert lift(0.2, 0.3) == pytest.approx(50.0)
    assert lift(0.0, 0.3) is None
    online = {"a": {"m": 0.2}, "b": {"m": 0.3}, "c": {"m": 0.1}}
    offline = {"a": {"m": 0.1}, "b": {"m": 0.2}, "c": {"m": 0.1}}
    # pairs (a,b): offline +100, online +50 -> 50; (a,c): offline 0, online -50 -> 50
    assert gap(offline, online, [("a", "b"), ("a", "c")]) == {"m": pytest.approx(50.0)}


def test_exposure_is_popularity_biased_and_seeded():
    pop = {"hit": 1000, "niche": 10}
    items = ["hit"] * 200 + ["niche"] * 200
    m = exposure_mask(items, pop, 1.0, 0)
    assert all(m[:200])  # (1000/1000)^1 = 1
    assert sum(m[200:]) < 10  # ~1 %
    assert m == exposure_mask(items, pop, 1.0, 0)
    assert all(exposure_mask(items, pop, 0.0, 0))  # alpha 0: everything logged


def test_vllm_worker_requests_round_trip_exactly(ml1m):
    """The vLLM throughput worker judges the very requests the parent built."""
    r = request_for(ml1m, "10", "Heat (1995)", sigma=-0.25, meta={"kind": "x"})
    again = request_from_dict(json.loads(json.dumps(request_to_dict(r))))
    assert again == r


def test_augment_labelling_methods_never_add_a_negative():
    cands = ["a", "b", "c", "d"]
    scores = {("u", "a"): 0.9, ("u", "b"): 0.8, ("u", "c"): 0.7, ("u", "d"): 0.95}
    yes = {("u", "b"), ("u", "c")}  # the judge said NO to a and d, though p_yes ranks them high
    assert choose("u", cands, scores, yes, 2) == ["b", "c"]
    assert choose("u", cands, scores, {("u", "c")}, 2) == ["c"]  # fewer than M: no filler
    assert choose("u", cands, scores, None, 2) == ["d", "a"]  # a ranking heuristic
    assert "item-item" in METHODS and set(LABELLING) <= set(METHODS)


@pytest.mark.e2e
def test_brief_offline_imputes_through_the_evaluators_code(smollm, tmp_path):
    cfg = OfflineConfig(
        model="smollm2-135m",
        data="ml-100k",
        users=1,
        systems=("pop", "als"),
        judges=("brief", "no-behavior"),
        history_items=10,
        logging_seeds=(0, 1),
    )
    r = bench_brief_offline(cfg, tmp_path, llm=smollm, progress=False)
    assert r["logging_seeds"] == [0, 1] and set(r["seeds"]) == {"0", "1"}
    pairs: dict[str, set] = {"brief": set(), "no-behavior": set()}
    for s, res in r["seeds"].items():
        folder = tmp_path / "impute" / f"seed-{s}"
        for mode in pairs:
            # The judge's labels are the qrels `recjudge impute` writes, and only unlogged pairs.
            qrels = read_qrels(folder / mode / "qrels_imputed.json")
            logged = read_qrels(folder / mode / "qrels_logged.json")
            assert set(qrels) == set(res["users"]) == set(logged)
            assert all(any(v.values()) for v in logged.values())  # a logged positive each
            labelled = res["imputers"][f"judge:{mode}"]["labelled"]
            assert labelled == res["imputers"]["cf"]["labelled"] > 0
            assert res["imputers"]["all-yes"]["labelled"] == labelled  # the no-model reference
            assert res["imputers"]["all-yes"]["positive_rate"] == 1.0
            assert res["imputers"]["all-yes"]["recall_vs_online"] in (0.0, 1.0)
            assert labelled == sum(len(qrels[u]) - len(logged[u]) for u in qrels)
            pairs[mode] |= {(u, i) for u in qrels for i in qrels[u] if i not in logged[u]}
        # Recall cannot be computed with imputation (BRIEF 4.2): never in a gap.
        assert not any(k.startswith("recall@") for g in res["gap"].values() for k in g)
    # One store for both logs: a pair both logs leave unlabelled is judged once per mode ...
    with sqlite3.connect(tmp_path / "store.sqlite") as db:
        assert db.execute("SELECT count(*) FROM results").fetchone()[0] == sum(
            len(v) for v in pairs.values()
        )
    # ... and brief and no-behavior (which differ only in the bias) share one decoding pass.
    with sqlite3.connect(tmp_path / "store.sqlite.decisions") as db:
        assert db.execute("SELECT count(*) FROM results").fetchone()[0] == len(pairs["brief"])
    # Speed: judgments made now (both modes, every pair once) from half as many passes.
    assert r["judged_now"] == sum(len(v) for v in pairs.values())
    assert r["decoding_passes"] == len(pairs["brief"]) and r["judgments_per_second"] > 0
    assert r["mean_gap_ci"]["logged"]["n"] == 2
    per_seed = [res["mean_gap"]["logged"] for res in r["seeds"].values()]
    assert r["mean_gap"]["logged"] == pytest.approx(np.mean(per_seed))
    # The user bootstrap's estimates are the reported gaps, with BRIEF paired against the rest.
    boot = r["user_bootstrap"]
    for m, v in r["mean_gap"].items():
        if v is not None:
            assert boot["mean_gap"][m]["estimate"] == pytest.approx(v)
    assert set(boot["brief_minus"]) == {"all-yes", "cf", "judge:no-behavior"}
    text = (tmp_path / "report.md").read_text()
    assert "simulated" in text and "Mean gap per logging seed" in text
    assert "Paired bootstrap over users" in text


def test_brief_offline_cuts_only_sasrec_training_and_says_so():
    cfg = OfflineConfig(systems=("als", "sasrec"), sasrec_epochs=7)
    assert untrained_system(cfg, "sasrec").config.epochs == 7
    assert untrained_system(cfg, "als").config == type(untrained_system(cfg, "als").config)()
    assert "SASRec 7 epochs" in _sasrec_note(cfg)
    assert _sasrec_note(cfg.model_copy(update={"systems": ("als",)})) == ""
    with pytest.raises(ValueError):
        OfflineConfig(sasrec_epochs=0)


def test_brief_offline_systems_train_once_then_load(ml100k, tmp_path, monkeypatch):
    monkeypatch.setenv("RECJUDGE_CACHE", str(tmp_path))
    cfg = OfflineConfig(data="ml-100k")
    past, _ = timeline_split(ml100k.interactions, fraction=cfg.future_fraction)
    first = trained_system(cfg, ml100k, past, "itemknn")
    (folder,) = (tmp_path / "cf").iterdir()
    cls = type(first)

    def no_training(*a, **k):
        raise AssertionError("trained again")

    monkeypatch.setattr(cls, "train", no_training)
    again = trained_system(cfg, ml100k, past, "itemknn")  # loaded from the cache
    hist = past[past["user_id"] == past["user_id"].iloc[0]]["item_id"].astype(str).tolist()
    assert again.recommend(hist, 10) == first.recommend(hist, 10)
    assert list((tmp_path / "cf").iterdir()) == [folder]
    # Another past (another split) is another model.
    monkeypatch.undo()
    monkeypatch.setenv("RECJUDGE_CACHE", str(tmp_path))
    other = past.iloc[: len(past) // 2]
    trained_system(cfg, ml100k, other, "itemknn")
    assert len(list((tmp_path / "cf").iterdir())) == 2


def test_seed_interval_by_hand():
    ci = seed_interval([10.0, 12.0, 14.0, None])  # None (an undefined gap) is left out
    half = 4.302652729911275 * 2.0 / np.sqrt(3)  # t_{0.975, 2} * sd / sqrt(n)
    assert ci["n"] == 3 and ci["mean"] == pytest.approx(12.0) and ci["sd"] == pytest.approx(2.0)
    assert (ci["lo"], ci["hi"]) == pytest.approx((12.0 - half, 12.0 + half))
    assert seed_interval([5.0]) == {"mean": 5.0, "lo": None, "hi": None, "sd": None, "n": 1}
    assert seed_interval([None])["mean"] is None


def test_brief_augment_labels_through_the_evaluators_code(smollm, tmp_path):
    cfg = AugmentBenchConfig(
        model="smollm2-135m",
        data="ml-100k",
        users=2,
        candidates=4,
        add=2,
        methods=("none", "cf-only", "no-behavior"),
        retrain=("pop",),
        seeds=1,
        history_items=10,
    )
    r = bench_brief_augment(cfg, tmp_path, llm=smollm, progress=False)
    inter = load_dataset(str(tmp_path / "augment/no-behavior")).interactions
    judge_rows = inter[inter["source"] == "judge"]
    # What the bench added is exactly what `recjudge augment` wrote: YES only, <= M per user.
    assert r["added_items"]["no-behavior"] == len(judge_rows)
    assert all(n <= 2 for n in judge_rows.groupby("user_id", observed=True).size())
    assert (judge_rows["p_yes"] >= 0).all() and r["added_items"]["none"] == 0
    assert set(r["table"]["pop"]) == {"none", "cf-only", "no-behavior"}
    # Each method is paired against no augmentation on the same users and seeds.
    paired = r["paired"]["pop"]
    assert paired["users"] == 2 and set(paired["minus_none"]) == {"cf-only", "no-behavior"}
    diff = paired["minus_none"]["no-behavior"]["recall@10"]["estimate"]
    table = r["table"]["pop"]
    assert diff == pytest.approx(
        table["no-behavior"]["recall@10"]["mean"] - table["none"]["recall@10"]["mean"]
    )
    assert r["judging"]["requests"] >= r["judging"]["judged_now"] > 0
    assert "judgments made in this run" in (tmp_path / "report.md").read_text()


@pytest.mark.e2e
def test_brief_augment_resumes_without_retraining_or_judging_again(smollm, tmp_path, monkeypatch):
    cfg = AugmentBenchConfig(
        model="smollm2-135m", data="ml-100k", users=2, candidates=3, add=1,
        methods=("none", "random", "brief"), retrain=("pop",), seeds=2, history_items=10,
    )  # fmt: skip
    first = bench_brief_augment(cfg, tmp_path, llm=smollm, progress=False)
    assert len(list((tmp_path / "retrain").glob("pop-*.json"))) >= 2

    def refuse(*args, **kwargs):
        raise AssertionError("retrained although the result was kept")

    monkeypatch.setattr(MODELS.get("pop"), "train", refuse)
    again = bench_brief_augment(cfg, tmp_path, llm=smollm, progress=False)
    assert again["table"] == first["table"] and again["paired"] == first["paired"]
    assert again["judging"]["judged_now"] == 0  # every judgment read from the store
    # The other scoring history was kept by the same retrainings: no training either.
    logged = bench_brief_augment(
        cfg.model_copy(update={"score_from": "logged"}), tmp_path, llm=smollm, progress=False
    )
    assert logged["other_history"]["score_from"] == "augmented"
    assert logged["other_history"]["table"] == first["table"]
    assert first["other_history"]["table"] == logged["table"]
    assert logged["other_history"]["this_minus_other"]["pop"] == {}  # pop ignores history
    assert "scored from the augmented history" in (tmp_path / "report.md").read_text()


def test_level_ci_by_hand():
    levels, pos = [1, 1, 1, 1, 2, 2, 3], [1, 1, 1, 1, 0, 1, 0]
    ci = level_ci(levels, pos, 200, 0)
    assert list(ci) == [1, 2, 3]
    assert ci[1] == {"pct": 100.0, "lo": 100.0, "hi": 100.0, "n": 4}  # no variation to resample
    assert ci[2]["pct"] == 50.0 and ci[2]["n"] == 2
    assert 0.0 <= ci[2]["lo"] <= 50.0 <= ci[2]["hi"] <= 100.0
    assert ci[2]["lo"] < ci[2]["hi"]
    assert level_ci(levels, pos, 200, 0) == ci  # seeded
    assert level_ci(levels, pos, 0, 0)[2] == {"pct": 50.0, "lo": 50.0, "hi": 50.0, "n": 2}


def test_paired_difference_is_zero_for_a_setting_against_itself_and_antisymmetric():
    g = np.random.default_rng(1)
    ratings = g.integers(1, 6, size=60).astype(float)
    labels = [1] * 20 + [0] * 20
    a = {"rating": list(ratings + g.normal(0, 1.0, 60)), "relevance": list(g.random(40))}
    b = {"rating": list(g.random(60)), "relevance": list(g.random(40))}
    same = setting_difference(a, a, ratings, labels, 100, 0)
    for d in same.values():  # the same draw for both sides: every resample differs by 0
        assert (d["diff"], d["lo"], d["hi"], d["p"]) == (0.0, 0.0, 0.0, 1.0)
    ab = setting_difference(a, b, ratings, labels, 100, 0)
    ba = setting_difference(b, a, ratings, labels, 100, 0)
    for k in ab:
        assert ab[k]["diff"] == pytest.approx(-ba[k]["diff"])
        assert ab[k]["lo"] <= ab[k]["diff"] <= ab[k]["hi"]


def test_paired_difference_separates_a_large_effect_and_not_a_null_one():
    g = np.random.default_rng(2)
    ratings = np.repeat([1.0, 2.0, 3.0, 4.0, 5.0], 40)
    labels = [1] * 50 + [0] * 50
    good = {"rating": list(ratings + g.normal(0, 0.5, 200)),
            "relevance": [0.9] * 50 + [0.1] * 50}  # fmt: skip
    noise = {"rating": list(g.random(200)), "relevance": list(g.random(100))}
    d = setting_difference(good, noise, ratings, labels, 300, 0)
    assert d["pair_spearman"]["lo"] > 0 and d["pair_spearman"]["p"] < 0.05
    assert d["relevance_auc"]["lo"] > 0 and d["relevance_auc"]["diff"] > 0.3
    # Two settings that differ only by noise of the same kind: the CI covers 0.
    other = {"rating": list(g.random(200)), "relevance": list(g.random(100))}
    null = setting_difference(noise, other, ratings, labels, 300, 0)["pair_spearman"]
    assert null["lo"] < 0 < null["hi"]


def test_paired_against_brief_compares_rows_that_share_a_sigma_source():
    reqs = [SimpleNamespace(meta={"kind": "rating", "level": lv, "rating": float(lv)})
            for lv in (1, 2, 3, 4, 5)] + [
        SimpleNamespace(meta={"kind": "relevance", "label": lab}) for lab in (1, 0)
    ]  # fmt: skip
    rows = [("brief", "all"), ("brief", "positive"), ("non-adaptive", "all"),
            ("non-adaptive", "positive"), ("zero-shot", "-"), ("cf-only", "positive"),
            ("pub", "-")]  # fmt: skip
    settings = [(m if s == "-" else f"{m} [cf:{s}]", m, s, 25.0) for m, s in rows]
    results = {n: [SimpleNamespace(p_yes=0.1 * (i + k), log_odds=0.1 * (i + k))
                   for i in range(7)] for k, (n, *_) in enumerate(settings)}  # fmt: skip
    cfg = BriefExperimentConfig(bootstrap=10)
    got = paired_against_brief(reqs, results, settings, cfg)
    assert sorted(got) == sorted([
        "brief [cf:all] - brief [cf:positive]", "brief [cf:all] - non-adaptive [cf:all]",
        "brief [cf:all] - zero-shot", "brief [cf:all] - pub",
        "brief [cf:positive] - non-adaptive [cf:positive]", "brief [cf:positive] - zero-shot",
        "brief [cf:positive] - cf-only [cf:positive]", "brief [cf:positive] - pub",
    ])  # fmt: skip


def test_ratings_report_has_level_cis_paired_table_and_speed(smollm, tmp_path):
    # cf-only needs no LLM call: the whole report path at the cost of two ALS trainings.
    cfg = BriefExperimentConfig(
        model="smollm2-135m", data="ml-100k", users=3, modes=("cf-only",), bootstrap=20
    )
    r = bench_brief_ratings(cfg, tmp_path, llm=smollm, progress=False)
    assert (r["llm_judgments"], r["judged_now"]) == (0, 0)
    for a in r["modes"].values():
        assert set(a["pct_positive_ci"]) == set(a["pct_positive_by_level"])
        for lvl, c in a["pct_positive_ci"].items():
            assert c["pct"] == pytest.approx(a["pct_positive_by_level"][lvl])
            assert c["lo"] <= c["pct"] <= c["hi"]
    assert r["paired_vs_brief"] == {}  # no brief row to compare against
    report = (tmp_path / "report.md").read_text()
    assert "95 % bootstrap CI" in report and "paired bootstrap" in report
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["modes"].keys() == r["modes"].keys()


@pytest.mark.e2e
def test_judge_per_user_decides_bias_settings_from_one_pass(smollm, ml1m, tmp_path):
    reqs = []
    for user, cand, sigma in (("1", "Toy Story (1995)", 0.9), ("1", "Heat (1995)", -0.6),
                              ("2", "Toy Story (1995)", 0.1)):  # fmt: skip
        r = request_for(ml1m, user, cand)
        r.sigma = sigma
        reqs.append(r)
    cfg = BriefExperimentConfig(model="smollm2-135m", history_items=10)
    settings = [("brief", "brief", None, 25.0), ("nb", "no-behavior", None, 25.0),
                ("na", "non-adaptive", None, 5.0), ("zs", "zero-shot", None, 25.0)]  # fmt: skip
    judges = judges_for(cfg, smollm, None, settings)
    with ResultsStore(tmp_path / "s.sqlite") as store:
        out, counts, passes, replayed = judge_per_user(reqs, judges, store, False)
        # one pass per request for brief/nb/na, one per zero-shot judgment
        assert passes == 2 * len(reqs) and replayed == 0
        assert {n: c["new"] for n, c in counts.items()} == dict.fromkeys(judges, len(reqs))
        _, counts, passes, replayed = judge_per_user(reqs, judges, store, False)
        assert passes == 0 and {c["new"] for c in counts.values()} == {0}
        # a new bias setting: decided from the stored decision records, no model pass
        more = judges_for(cfg, smollm, None, [("b5", "brief", None, 5.0), *settings[1:2]])
        _, counts, passes, replayed = judge_per_user(reqs, more, store, False)
        assert (passes, replayed, counts["b5"]["new"]) == (0, len(reqs), len(reqs))
        # a lone setting too (a retrained CF model changes every key but the records')
        alone = judges_for(cfg, smollm, None, [("b10", "brief", None, 10.0)])
        _, counts, passes, replayed = judge_per_user(reqs, alone, store, False)
        assert (passes, replayed, counts["b10"]["new"]) == (0, len(reqs), len(reqs))
    for name in ("brief", "na"):
        # user by user, as judge_per_user decodes (several users in one call would round
        # differently in bf16: another batch shape)
        judge = judges_for(cfg, smollm, None, settings)[name]
        alone = judge.judge_many(reqs[:2]) + judge.judge_many(reqs[2:])
        assert [j.is_relevant for j in out[name]] == [j.is_relevant for j in alone]
        assert [j.p_yes for j in out[name]] == pytest.approx([j.p_yes for j in alone], abs=2e-3)


def test_beta_optimum_finds_the_peak_and_tests_it_against_beta_zero():
    ratings = [float(1 + i % 5) for i in range(40)]
    reqs = [NS(meta={"kind": "rating", "rating": r}) for r in ratings]
    reqs += [NS(meta={"kind": "relevance", "label": lab}) for lab in [1, 0] * 10]
    uncorrelated = [((i * 7) % 11) / 11 for i in range(40)]

    def judged(rating_scores, relevance_scores):
        return [NS(p_yes=x, log_odds=x) for x in [*rating_scores, *relevance_scores]]

    good = judged([r / 5 for r in ratings], [0.9, 0.1] * 10)
    results = {
        "beta=0": judged(uncorrelated, [0.5, 0.5] * 10),
        "beta=5": good,
        "beta=10": good,  # a tie goes to the smaller beta
        "beta=20": judged([1 - r / 5 for r in ratings], [0.1, 0.9] * 10),
    }
    analysis = {
        n: {"pair_spearman": {"rho": spearman_ci([j.p_yes for j in js[:40]], ratings, 0, 0)["rho"]},
            "relevance_auc": {"auc": auc([j.p_yes for j in js[40::2]],
                                         [j.p_yes for j in js[41::2]])}}
        for n, js in results.items()
    }  # fmt: skip
    opt = beta_optimum(reqs, results, analysis, BriefExperimentConfig(bootstrap=200))
    assert opt["pair_spearman"]["beta"] == 5.0 and opt["pair_spearman"]["value"] == 1.0
    assert opt["relevance_auc"]["beta"] == 5.0 and opt["relevance_auc"]["value"] == 1.0
    vs = opt["pair_spearman"]["vs_beta0"]
    assert vs["diff"] == pytest.approx(1.0 - analysis["beta=0"]["pair_spearman"]["rho"])
    assert vs["lo"] > 0  # a large effect on 40 pairs is separated from beta 0
    assert opt["relevance_auc"]["vs_beta0"]["diff"] == pytest.approx(0.5)
    # When beta 0 is the best there is nothing to compare it with.
    flat = {"beta=0": good, "beta=5": results["beta=20"]}
    flat_an = {"beta=0": analysis["beta=5"], "beta=5": analysis["beta=20"]}
    assert beta_optimum(reqs, flat, flat_an, BriefExperimentConfig())["pair_spearman"] == {
        "beta": 0.0, "value": 1.0, "vs_beta0": None,
    }  # fmt: skip


def test_a_resumed_run_loads_its_sigma_models_instead_of_training_them(tmp_path, monkeypatch):
    """The sigma models of a ratings/beta run are saved in its folder, keyed by what they
    were trained on: a restart loads them (no training) and gets the same sigmas; other
    training data gets its own."""
    cfg = BriefExperimentConfig(model="smollm2-135m", data="ml-100k", users=3)
    ds = load_dataset("ml-100k")
    _, info = _brief._requests(cfg, ds)
    past = info["past"]
    first = _brief._train_sigma_models(cfg, ds, past, tmp_path)
    assert len(list((tmp_path / "cf").iterdir())) == 2  # one folder per source

    def no_training(*a, **k):
        raise AssertionError("trained again")

    monkeypatch.setattr(_brief, "calibrated_cf", no_training)
    again = _brief._train_sigma_models(cfg, ds, past, tmp_path)
    hist = past[past["user_id"] == past["user_id"].iloc[0]]["item_id"].astype(str).tolist()
    cands = ds.items["item_id"].astype(str).tolist()[:20]
    for source in ("all", "positive"):
        for kind in ("cf", "item-item"):
            a, b = first[source][kind], again[source][kind]
            assert [a.sigma(hist, c) for c in cands] == [b.sigma(hist, c) for c in cands]
        assert again[source]["min_rating"] == first[source]["min_rating"]
    with pytest.raises(AssertionError, match="trained again"):
        _brief._train_sigma_models(cfg, ds, past.iloc[:-1], tmp_path)
