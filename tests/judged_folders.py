"""An impute-like folder of judgments with labels, for the calibration tests."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from recjudge.evaluators.offline._impute import _write_sidecar


def write_judged_folder(folder: Path, labels: Path, n: int, seed: int = 0, power: float = 1.0):
    """``folder``: ``imputed.jsonl`` (as impute writes it) and ``summary.json`` of ``n``
    judgments with p_yes = truth ** power over 7 users; ``labels``: a CSV of labels drawn
    with P(1) = truth. Returns the judgments."""
    g = np.random.default_rng(seed)
    folder.mkdir(parents=True)
    judged, rows = [], ["user_id,item_id,label"]
    for i in range(n):
        truth = float(g.random())
        p = truth**power
        judged.append(SimpleNamespace(error=None, user_id=f"u{i % 7}", candidate_id=f"i{i}",
                                      is_relevant=p > 0.5, p_yes=p, p_yes_semantic=p, sigma=0.0,
                                      delta=0.0, evidence=[], evidence_ids=[]))  # fmt: skip
        rows.append(f"u{i % 7},i{i},{int(g.random() < truth)}")
    _write_sidecar(folder / "imputed.jsonl", judged, [])
    (folder / "summary.json").write_text(json.dumps({"judge": {"model": "m", "mode": "brief"}}))
    labels.write_text("\n".join(rows) + "\n")
    return judged
