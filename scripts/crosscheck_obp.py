"""Cross-check recjudge's ``dm``/``ips``/``snips``/``dr`` against Open Bandit Pipeline's
estimators on the arrays ``recjudge.evaluators.to_obp`` exports, and write what obp computed
to ``tests/evaluators/data/obp_reference.json`` (inputs and obp's values), which
``tests/evaluators/test_obp.py`` checks recjudge against on every run of the suite.

obp is not in the lock: obp 0.5.7 declares Python < 3.11 and pins old scikit-learn, so it
runs from a throwaway folder on the path with the project's Python (its code runs on 3.11):

    pip install --target /tmp/obp_site --no-deps --ignore-requires-python obp==0.5.7 \
        seaborn mypy-extensions scikit-learn joblib threadpoolctl cloudpickle narwhals
    PYTHONPATH=/tmp/obp_site .venv/bin/python scripts/crosscheck_obp.py

Last run (2026-11-27, obp 0.5.7): see the line it prints.
"""

import json
from pathlib import Path

import numpy as np
import obp
from obp.ope import (
    DirectMethod,
    DoublyRobust,
    InverseProbabilityWeighting,
    SelfNormalizedInverseProbabilityWeighting,
)

from recjudge.evaluators.offline._estimators import ListLabels, estimate
from recjudge.evaluators.offline._obp import to_obp

OUT = Path(__file__).resolve().parents[1] / "tests/evaluators/data/obp_reference.json"
OBP = {
    "dm": DirectMethod(),
    "ips": InverseProbabilityWeighting(),
    "snips": SelfNormalizedInverseProbabilityWeighting(),
    "dr": DoublyRobust(),
}


def problem(g: np.random.Generator) -> dict:
    """A random evaluation: users with lists of up to k slots (some shorter), true
    relevance, observation by propensity, a noisy judge (inputs rounded to 4 decimals: the
    file stores them exactly)."""
    users, k = int(g.integers(5, 25)), int(g.choice([5, 10, 20]))
    lists = {}
    for u in range(users):
        n = k if g.random() < 0.8 else int(g.integers(1, k + 1))
        theta = np.round(np.clip(g.beta(0.7, 2.0, n), 0.02, 1.0), 4)
        rel = (g.random(n) < g.uniform(0.05, 0.6)).astype(float)
        obs = (g.random(n) < theta).astype(float)
        p = np.round(np.clip(rel * 0.5 + g.uniform(0, 0.5, n), 0, 1), 4)
        lists[f"u{u}"] = {"observed": obs.tolist(), "label": (rel * obs).tolist(),
                          "p": p.tolist(), "hard": (p > 0.5).astype(float).tolist(),
                          "propensity": theta.tolist()}  # fmt: skip
    return {"k": k, "lists": lists}


def as_lists(prob: dict) -> dict[str, ListLabels]:
    return {u: ListLabels(*(np.asarray(x[f]) for f in ("observed", "label", "p", "hard",
                                                         "propensity")))
            for u, x in prob["lists"].items()}  # fmt: skip


def main() -> None:
    g = np.random.default_rng(11)
    cases, worst = [], 0.0
    for _ in range(12):
        prob = problem(g)
        lists = as_lists(prob)
        for metric in (f"precision@{prob['k']}", f"ndcg_fixed@{prob['k']}", f"dcg@{prob['k']}"):
            arrays = to_obp(lists, metric)
            theirs = {}
            for name, est in OBP.items():
                args = {k: v for k, v in arrays.items()
                        if k in est.estimate_policy_value.__code__.co_varnames}  # fmt: skip
                theirs[name] = float(est.estimate_policy_value(**args))
            ours = estimate(lists, [metric], list(OBP), draws=0)[metric]
            worst = max(worst, *(abs(ours[e].value - v) for e, v in theirs.items()))
            cases.append({"metric": metric, "obp": theirs, **prob})
    OUT.write_text(json.dumps({"obp_version": obp.__version__, "cases": cases}) + "\n")
    print(
        f"obp {obp.__version__} vs recjudge, {len(cases)} problems x {len(OBP)} "
        f"estimators: max abs difference {worst:.2e}; wrote {OUT}"
    )


if __name__ == "__main__":
    main()
