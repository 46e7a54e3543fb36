"""Compile ranx's numba kernels once at set-up (numba caches them on disk).

ranx is the reference our ranking metrics are cross-checked against; on a fresh machine its
first evaluation JIT-compiles every metric, minutes on 2 cores, which would otherwise land
in the first test that calls it. numba compiles one specialisation per argument layout, and
a toy run of two queries does not produce the ones a real run needs, so this warms ranx with
runs shaped like real ones (many queries, ranked lists of 20, several relevant items), in
both call forms (a list of metrics and a single metric name take different paths).
"""

import warnings

import numpy as np
from ranx import Qrels, Run, evaluate

# numba warns about a uint64 -> int64 cast inside ranx on every compile; not ours to fix.
warnings.filterwarnings("ignore")
g = np.random.default_rng(0)
qrels, run = {}, {}
for q in range(25):
    relevant = {f"i{j}" for j in g.choice(60, size=int(g.integers(1, 12)), replace=False)}
    ranked = [f"i{j}" for j in g.permutation(60)[:20]]
    qrels[f"q{q}"] = dict.fromkeys(relevant, 1)
    run[f"q{q}"] = {item: 20.0 - r for r, item in enumerate(ranked)}
qrels, run = Qrels(qrels), Run(run)
metrics = ["precision", "hit_rate", "ndcg", "map", "recall"]
evaluate(qrels, run, [f"{m}@{k}" for m in metrics for k in (5, 10, 20)] + ["mrr"])
for m in metrics:
    evaluate(qrels, run, f"{m}@10")
evaluate(qrels, run, "mrr")

# Scores drawn at random (not rank-like) and small queries take other specialisations.
items = [f"i{j}" for j in range(12)]
table = {str(u): {it: float(g.random()) for it in items} for u in range(6)}
qrels = Qrels({u: {items[1 + (int(u) + k) % 11]: 1 for k in (0, 3)} for u in table})
run = Run({u: {it: s for it, s in table[u].items() if it != "i0"} for u in table})
for k in (5, 10):
    evaluate(qrels, run, f"ndcg@{k}")
    evaluate(qrels, run, f"recall@{k}")

# recjudge evaluate: ranx.compare (per-query scores, the paired t-test) on two and three runs
# with make_comparable, over the metrics evaluate reports by default.
from ranx import compare  # noqa: E402

runs = []
for n in range(3):
    ranked = {f"q{q}": {f"i{j}": float(10 - r) for r, j in enumerate(g.permutation(60)[:10])}
              for q in range(25)}  # fmt: skip
    runs.append(Run(ranked, name=f"s{n}"))
qrels = Qrels({f"q{q}": {f"i{j}": 1 for j in g.choice(60, size=3, replace=False)}
               for q in range(25)})  # fmt: skip
for rs in (runs[:2], runs):
    compare(qrels, rs, ["ndcg@10", "precision@10", "recall@10", "mrr@10"], make_comparable=True)
    compare(qrels, rs, ["ndcg@3", "precision@3"], make_comparable=True)

# Item ids of other widths take other data-structure kernels (ranx stores ids as numpy
# fixed-width strings): the tests cross-check our metrics with ranx on raw ids of 1 to 4
# characters (MovieLens), each width compiled once here.
for width in (1, 4):
    ids = [str(j).rjust(width, "7")[-width:] for j in range(10)]
    qrels = Qrels({f"q{q}": {ids[(q + j) % 10]: 1 for j in (0, 4)} for q in range(8)})
    run = Run({f"q{q}": {ids[j]: float(10 - j) for j in range(10)} for q in range(8)})
    evaluate(qrels, run, ["ndcg@3", "precision@3"])
    compare(qrels, [run, Run(run.to_dict(), name="b")], ["ndcg@3"], make_comparable=True)

# recjudge evaluate itself (fixed-width item codes, evaluators._evaluate.ID_WIDTH): every
# metric it offers, under each of its paired tests.
from recjudge.evaluators import EvaluateConfig, evaluate_runs  # noqa: E402
from recjudge.evaluators.offline._evaluate import METRICS  # noqa: E402
from recjudge.evaluators.offline._runs import RecRun, RunCheck  # noqa: E402

users = [str(u) for u in range(12)]
ours = {"logged": {u: {f"m{(int(u) + j) % 30}": 1 for j in (0, 7)} for u in users}}
systems = [
    RecRun(name, "-", {u: [f"m{(int(u) * s + j) % 30}" for j in range(10)] for u in users}, {},
           RunCheck())
    for name, s in (("a", 1), ("b", 3))
]  # fmt: skip
for test in ("student", "fisher", "tukey"):
    cfg = EvaluateConfig(metrics=tuple(f"{m}@5" for m in METRICS), k=10, stat_test=test)
    evaluate_runs(ours, systems, users, cfg)
