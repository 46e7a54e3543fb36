"""`judge tune --exclude-users` (issue 111): every bad users file is named with a fix that
exists (judge tune has no --encoding), a bad JSONL line by its number."""

from __future__ import annotations

import pytest

from recjudge.data import DataError
from recjudge.tune import read_user_ids

CASES = [
    ("bad.jsonl", b'{"user_id": 1}\n{bad\n', "row 2: not a JSON object on this line"),
    ("latin.txt", b"caf\xe9\n", "not UTF-8 text (byte 0xe9"),
    ("latin.csv", b"user_id\ncaf\xe9\n", "cannot decode byte 0xe9"),
    ("empty.txt", b"", "holds no user id"),
    ("nocol.csv", b"uid\n1\n", "no user_id column"),
]


@pytest.mark.parametrize(("name", "data", "words"), CASES, ids=[c[0] for c in CASES])
def test_a_bad_users_file_is_named_with_a_fix_that_exists(tmp_path, name, data, words):
    (tmp_path / name).write_bytes(data)
    with pytest.raises(DataError) as err:
        read_user_ids(tmp_path / name)
    text = str(err.value)
    assert words in text and name in text and "--encoding" not in text and "Fix:" in text


def test_a_folder_is_not_called_missing(tmp_path):
    with pytest.raises(DataError, match="a folder, not a users file"):
        read_user_ids(tmp_path)


def test_ids_one_per_line_or_in_a_column(tmp_path):
    (tmp_path / "u.txt").write_text("3\n1\n\n3\n")
    (tmp_path / "u.csv").write_text("user_id,x\n2,a\n1,b\n")
    assert read_user_ids(tmp_path / "u.txt") == ["1", "3"]
    assert read_user_ids(tmp_path / "u.csv") == ["1", "2"]
