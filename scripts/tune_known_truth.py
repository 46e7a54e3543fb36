"""Tune a judge for the known-truth world of ``bench brief-offline-estimators`` (issue 88): LoRA
on that world's past split (each user's timeline before its last 20 %, the split the world's
recommenders train on), never reading any of the world's users, so the tuned judge is an
imputer whose training saw neither their past nor their online truth. The settings are those
of ``reports/judge-tuning/ml-1m-qwen2.5-coder-0.5b-readout-margin`` (tune-v3: 120 steps of
4, decision weight 1, 200 tuning users, 20 validation users, 10-item histories).

    .venv/bin/python scripts/tune_known_truth.py OUT_FOLDER [MODEL [NEGATIVES]] \
        [--min-rating R] [--users N] [--validation-users V]

NEGATIVES is ``uniform`` (tune-v3's, the default) or ``listed``: the negatives (and the
positives) drawn from the user's item-kNN and popularity top-20 lists, with 40 validation
users (a user has at most 2 positives in its list, so 20 users would validate on ~56 pairs).
``--min-rating 4`` keeps only later items rated >= 4 as positives, as the world's online truth
counts them (default: any later interaction); ``--users`` (default 200) and
``--validation-users`` (default 20 uniform, 40 listed) size the tuning.
    # then: recjudge bench run brief-offline-estimators --config CONFIG --out DIR
    # with CONFIG's "model" = OUT_FOLDER and "history_items" = 10

The bench refuses a tuned folder whose card shows it read any of the world's users.
Runs (2-core EPYC): reports/brief-offline-estimators/ml-1m-qwen2.5-coder-0.5b-tuned (uniform,
2026-12-06), reports/judge-tuning/ml-1m-qwen2.5-coder-0.5b-listed-negatives (listed) and
...-listed-negatives-min-rating-4 (listed, --min-rating 4; 2026-12-07): each folder's README
has the command and the cost.
"""

import argparse
import json
import time
from pathlib import Path

from recjudge.bench._offline import _simulate_log
from recjudge.bench._offline_estimators import EstimatorCheckConfig
from recjudge.data import load_dataset
from recjudge.tune import TuneConfig, tune

CONFIG = Path(__file__).resolve().parents[1] / "checkpoints/brief-offline-ml1m-1.5b/estimators.json"


def main(folder: Path, model: str, negatives: str = "uniform", min_rating: float | None = None,
         users_n: int = 200, validation: int | None = None) -> None:  # fmt: skip
    world = EstimatorCheckConfig(**json.loads(CONFIG.read_text()))
    ds = load_dataset(world.data)
    logs = [_simulate_log(world, ds, s) for s in world.log_seeds()]
    users = list(dict.fromkeys(u for log in logs for u in log.users))
    past = ds.with_interactions(logs[0].past, "brief-offline-estimators' world: the past split")
    tc = TuneConfig(model=model, max_history=10, future_fraction=world.future_fraction,
                    steps=120, batch_size=4, lr=2e-4, eval_every=20, patience=3,
                    decision_weight=1.0, max_users=users_n, min_rating=min_rating,
                    validation_users=validation or (20 if negatives == "uniform" else 40),
                    positives_per_user=2, seed=world.seed, negatives=negatives)  # fmt: skip
    t0 = time.time()
    resume = (Path(f"{folder}.tune") / "state.json").is_file()
    tune(tc, past, folder, exclude_users=users, resume=resume, progress=True, log=print)
    print(f"tuned in {time.time() - t0:.0f} s, the world's {len(users)} users excluded -> {folder}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("model", nargs="?", default="qwen2.5-coder-0.5b")
    ap.add_argument("negatives", nargs="?", default="uniform", choices=["uniform", "listed"])
    ap.add_argument("--min-rating", type=float, default=None)
    ap.add_argument("--users", type=int, default=200)
    ap.add_argument("--validation-users", type=int, default=None)
    a = ap.parse_args()
    main(a.folder, a.model, a.negatives, a.min_rating, a.users, a.validation_users)
