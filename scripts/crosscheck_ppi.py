"""Cross-check recjudge's PPI mean estimator against ppi-python (not in the lock: it needs
statsmodels, scikit-learn and gdown). Run it with ppi-python on the path, e.g.:

    pip install --target /tmp/ppi_site --no-deps ppi-python statsmodels scikit-learn patsy \
        joblib gdown cloudpickle narwhals
    PYTHONPATH=/tmp/ppi_site .venv/bin/python scripts/crosscheck_ppi.py

Last run (2026-11-27, ppi-python 0.2.3): max abs difference 2.22e-16 over 20 problems x 3 lams.
"""

import numpy as np
from ppi_py import ppi_mean_ci, ppi_mean_pointestimate

from recjudge.evaluators.offline._gold_ppi import ppi_mean

g = np.random.default_rng(3)
worst = 0
for _ in range(20):
    n, N = int(g.integers(20, 400)), int(g.integers(500, 5000))
    truth = g.random(n + N)
    y = (g.random(n) < truth[:n]).astype(float)
    yhat = np.clip(truth[:n] ** g.uniform(0.5, 3) + g.normal(0, 0.1, n), 0, 1)
    yu = np.clip(truth[n:] ** 1.5, 0, 1)
    for lam in (None, 1.0, 0.0):
        ours = ppi_mean(y, yhat, yu, lam=lam, alpha=0.05)
        pe = float(np.squeeze(ppi_mean_pointestimate(y, yhat, yu, lam=lam)))
        lo, hi = (float(np.squeeze(v)) for v in ppi_mean_ci(y, yhat, yu, alpha=0.05, lam=lam))
        worst = max(worst, abs(ours["value"] - pe), abs(ours["lo"] - lo), abs(ours["hi"] - hi))
print(f"ppi-python vs recjudge ppi_mean, 20 problems x 3 lams: max abs difference {worst:.2e}")
