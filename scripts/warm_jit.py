"""Compile ranx's numba kernels once at set-up (numba caches them on disk).

ranx is the reference our ranking metrics are cross-checked against; on a fresh machine its
first evaluation JIT-compiles every metric, minutes on 2 cores, which would otherwise land
in the first test that calls it.
"""

from ranx import Qrels, Run, evaluate

qrels = Qrels({"q1": {"a": 1, "b": 1}, "q2": {"c": 1}})
run = Run({"q1": {"a": 2.0, "x": 1.0}, "q2": {"y": 2.0, "c": 1.0}})
metrics = ["precision@10", "hit_rate@10", "ndcg@10", "map@10", "mrr", "recall@10"]
evaluate(qrels, run, metrics)
