"""A toy world for the report tests (imported by them): a dataset folder and two runs."""

from __future__ import annotations

import json
from pathlib import Path

from recjudge.data import load_from_files


def write_toy_world(folder: Path, users: int = 12) -> Path:
    """``folder/ds`` (logged ratings), ``folder/a.jsonl`` and ``folder/b.jsonl`` (top-5)."""
    log = "user_id,item_id,timestamp,rating\n" + "".join(
        f"u{u},i{i},{10 * u + i},{1 + (u + i) % 5}\n" for u in range(users) for i in range(8)
    )
    items = "item_id,title\n" + "".join(f"i{i},Movie {i} (199{i % 10})\n" for i in range(12))
    (folder / "log.csv").write_text(log)
    (folder / "items.csv").write_text(items)
    load_from_files(folder / "log.csv", folder / "items.csv", name="toy").save(folder / "ds")
    for name, order in (("a", (8, 9, 10, 11, 3)), ("b", (11, 10, 2, 9, 8))):
        (folder / f"{name}.jsonl").write_text("".join(
            json.dumps({"user_id": f"u{u}", "item_id": f"i{i}", "score": 10 - r}) + "\n"
            for u in range(users) for r, i in enumerate(order)))  # fmt: skip
    return folder
