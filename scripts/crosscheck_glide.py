"""Cross-check recjudge's clustered PPI against GLIDE (glide-py; not in the lock: it asks for
Python 3.12, though its code runs on 3.11). Writes the problems and GLIDE's answers to
tests/evaluators/data/glide_reference.json, which the suite checks recjudge against:

    pip download --no-deps --only-binary=:all: --python-version 3.12 -d /tmp/glide glide-py
    unzip -q /tmp/glide/glide_py-*.whl -d /tmp/glide/x
    PYTHONPATH=/tmp/glide/x .venv/bin/python scripts/crosscheck_glide.py

Last run (2026-12-01, glide-py 0.11.0): max abs difference 4.44e-16 over 24 problems x 2 lams.
"""

import json
from pathlib import Path

import numpy as np
from glide.estimators import ClusteredPPIMeanEstimator

from recjudge.evaluators.offline._ppi import clustered_ppi_mean

OUT = Path(__file__).resolve().parents[1] / "tests/evaluators/data/glide_reference.json"
g = np.random.default_rng(11)
problems, worst = [], 0.0
for _ in range(24):
    users, labelled = int(g.integers(8, 40)), int(g.integers(3, 7))
    sizes = g.integers(1, 8, users)  # pairs per user (list lengths differ)
    taste = g.normal(0, 1, users)  # a user's labels are correlated
    clusters = np.repeat(np.arange(users), sizes)
    p_true = 1 / (1 + np.exp(-(taste[clusters] + g.normal(0, 1, len(clusters)))))
    y = (g.random(len(clusters)) < p_true).astype(float)
    proxy = np.clip(p_true + g.normal(0.1, 0.15, len(clusters)), 0, 1)
    gold = g.permutation(users)[:labelled]
    y_true = np.where(np.isin(clusters, gold), y, np.nan)
    if np.ptp(y_true[~np.isnan(y_true)]) == 0:
        continue
    answers = {}
    for name, tune in (("tuned", True), ("lam1", False)):
        r = ClusteredPPIMeanEstimator().estimate(
            y_true, proxy, clusters.astype(str), power_tuning=tune
        )
        ci = r.confidence_interval
        answers[name] = [float(ci.mean), float(ci.lower_bound), float(ci.upper_bound)]
        ours = clustered_ppi_mean(
            y_true, proxy, clusters, lam=None if tune else 1.0, quantile="normal"
        )
        worst = max(
            worst,
            *(
                abs(a - b)
                for a, b in zip(answers[name], (ours["value"], ours["lo"], ours["hi"]), strict=True)
            ),
        )
    problems.append(
        {
            "y_true": [None if np.isnan(v) else v for v in y_true.tolist()],
            "y_proxy": proxy.tolist(),
            "clusters": clusters.tolist(),
            "glide": answers,
        }
    )
OUT.write_text(json.dumps({"glide_py": "0.11.0", "problems": problems}) + "\n")
print(
    f"glide-py ClusteredPPIMeanEstimator vs recjudge clustered_ppi_mean, {len(problems)} "
    f"problems x 2 lams: max abs difference {worst:.2e} -> {OUT}"
)
