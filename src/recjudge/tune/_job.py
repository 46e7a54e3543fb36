"""``recjudge judge tune``: the registered job around ``tune.tune`` (files in, folder out)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from recjudge._tune_config import TuneConfig, TuneJob
from recjudge.data import DataError, load_dataset, read_table
from recjudge.tune._trainer import tune

__all__ = ["TuneJob", "read_user_ids", "run_tune", "tune_text"]


def read_user_ids(path: str | Path) -> list[str]:
    """User ids from a table with a ``user_id`` column, or a text file of one id per line.

    Raises:
        DataError: a missing file, or a table without ``user_id`` (file and fix named).
    """
    path = Path(path)
    fix = "give a CSV/JSONL/Parquet file with a user_id column, or one user id per line"
    if path.is_dir():
        raise DataError("a folder, not a users file.", source=str(path),
                        fix=f"give a file in it ({fix})")  # fmt: skip
    if not path.is_file():
        raise DataError("no such users file.", source=str(path), fix=fix)
    utf8 = "save it as UTF-8 (judge tune reads the users file as UTF-8)"
    if path.suffix.lower() in (".csv", ".jsonl", ".json", ".parquet", ".tsv"):
        try:
            df = read_table(path)
        except DataError as e:  # its own fix names data import's --encoding
            raise DataError(e.problem, source=e.source, row=e.row, field=e.field,
                            fix=utf8 if "decode" in e.problem else fix) from None  # fmt: skip
        if "user_id" not in df.columns:
            raise DataError(f"no user_id column; found {list(df.columns)}.", source=str(path),
                            field="user_id", fix=fix)  # fmt: skip
        ids = sorted({str(u) for u in df["user_id"].tolist()})
    else:
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError as e:
            raise DataError(f"not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset "
                            f"{e.start}).", source=str(path), fix=utf8) from None  # fmt: skip
        ids = sorted({ln.strip() for ln in lines if ln.strip()})
    if not ids:
        raise DataError("holds no user id: --exclude-users would exclude nobody.",
                        source=str(path), fix=f"{fix}; or drop --exclude-users")  # fmt: skip
    return ids


def run_tune(job: TuneJob, progress: bool = True,
             warn: Callable[[str], None] | None = None) -> dict[str, Any]:  # fmt: skip
    """Tune the judge's model on ``job.data`` and write the merged folder (see ``tune.tune``);
    returns the card."""
    config = TuneConfig(**{f: getattr(job, f) for f in TuneConfig.model_fields})
    excluded = read_user_ids(job.exclude_users) if job.exclude_users else []
    data = load_dataset(job.data)
    res = tune(config, data, job.out, exclude_users=excluded, resume=job.resume,
               progress=progress, log=warn)  # fmt: skip
    return {"out": str(res.out), "excluded_users": len(excluded), **res.card}


def tune_text(job: TuneJob, card: dict[str, Any]) -> str:
    """``judge tune``'s console summary."""
    auc0, auc = card["validation_auc_before"], card["validation_auc"]
    fmt = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
    p = card["pairs"]
    return (
        f"tuned {card['base_model']} on {p['train']} pairs ({p['train_positive']} positive) of "
        f"{card['data']['users_read'] - p['validation_users']} users in {card['steps']} steps "
        f"({card['seconds']} s); validation AUC (decision score, {p['validation']} pairs of "
        f"{p['validation_users']} held-out users) {fmt(auc0)} -> {fmt(auc)} (best step "
        f"{card['best_step']}{'' if card['best_step'] else ': the base weights, no step beat them'}"
        f") -> {card['out']}. Judge with it: --model {card['out']}"
    )
