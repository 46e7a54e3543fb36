"""Bad input on the command line: exit 2 with one line naming the file (row, field) and a
fix; never a traceback."""

from __future__ import annotations

import pytest

# The command through the CLI's entry point in this process (exit code, stdout, stderr as a
# user sees them; no interpreter start-up per case).
from cli_in_process import run_cli as run
from recjudge.data import DataError, load_from_files


def _clear_failure(r, *words):
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr and r.stderr.startswith("error: ")
    for w in words:
        assert w in r.stderr, (w, r.stderr)


def test_missing_model_path(tmp_path):
    r = run("judge", "--data", "ml-100k", "--user", "1", "--candidate", "1", "--mode",
            "zero-shot", "--model", "./missing/dir")  # fmt: skip
    _clear_failure(r, "./missing/dir", "does not exist", "smollm2-135m")


def test_pairs_line_that_is_not_an_object(tmp_path):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text('{"user_id": "1", "item_id": "1"}\n["1", "1"]\n')
    r = run("judge", "--data", "ml-100k", "--pairs", str(pairs), "--out",
            str(tmp_path / "o.jsonl"), "--mode", "zero-shot")  # fmt: skip
    _clear_failure(r, f"{pairs}, line 2", "JSON list, not an object", '{"user_id": ...')


def test_cache_under_a_file(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    r = run("models", "info", "smollm2-135m", env={"RECJUDGE_CACHE": str(blocker / "cache")})
    _clear_failure(r, str(blocker / "cache"), "cannot be created", "$RECJUDGE_CACHE")


@pytest.mark.parametrize("broken", ["card.json", "interactions.parquet", "items.parquet"])
def test_data_info_on_a_damaged_dataset_folder(tmp_path, ml100k, broken):
    folder = tmp_path / "ds"
    ml100k.save(folder)
    (folder / broken).write_bytes(b"\x00garbage")
    r = run("data", "info", str(folder))
    _clear_failure(r, str(folder / broken), "cannot read this dataset folder", "Fix:")


def test_users_file_without_user_id(tmp_path):
    log, users = tmp_path / "log.csv", tmp_path / "users.csv"
    log.write_text("user_id,item_id\nu1,a\n")
    users.write_text("uid,age\nu1,30\n")
    with pytest.raises(DataError, match="users.csv, field 'user_id': missing column") as e:
        load_from_files(log, users=users)
    assert "['uid', 'age']" in str(e.value)
