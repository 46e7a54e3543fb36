"""A tuned folder's card and users record without weights: what the leakage rules read."""

from __future__ import annotations

import json

from recjudge._util import sha256_file
from recjudge.llm._card import TUNED_CARD, user_hash


def fake_tuned(folder, last_time: dict[str, float]):
    """A tuned folder's card and users record (what the leakage rules read; no weights)."""
    folder.mkdir(parents=True, exist_ok=True)
    users = folder / "tuning-users.json"
    users.write_text(json.dumps({"format": "recjudge-tuning-users",
                                 "last_time": {user_hash(u): t for u, t in last_time.items()},
                                 "validation": []}))  # fmt: skip
    card = {"format": "recjudge-tuned", "users_sha256": sha256_file(users),
            "weights_sha256": {"model.safetensors": "0" * 64}}  # fmt: skip
    (folder / TUNED_CARD).write_text(json.dumps(card))
    return folder
