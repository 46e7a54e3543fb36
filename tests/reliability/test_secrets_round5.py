"""Issue 91, secrets: credentials planted in a server URL, a Ray address or a tracking URI
never appear in any output of the run (stdout, stderr, any file it writes), and a server URL
with credentials is refused before anything runs (the key belongs in the environment)."""

from __future__ import annotations

import json

import pytest
import typer
from pydantic import ValidationError

from cli_in_process import run_cli
from recjudge.cli._app import fail
from recjudge.llm import LLMConfig

PLANTED = "PLANTED-pw-91"


def _files_hold(folder, text: str) -> list[str]:
    return [str(p) for p in folder.rglob("*") if p.is_file() and text.encode() in p.read_bytes()]


@pytest.fixture
def pairs(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps({"user_id": "1", "candidate": "50"}) + "\n")
    return path


@pytest.mark.parametrize("args", [
    ["--server", f"http://user:{PLANTED}@127.0.0.1:9/v1", "judge", "--data", "ml-100k",
     "--user", "1", "--candidate", "50", "--mode", "no-behavior"],
    ["--server", f"https://{PLANTED}@gpu-box/v1", "judge", "--data", "ml-100k", "--pairs",
     "pairs.jsonl", "--out", "out", "--mode", "no-behavior"],
    ["judge", "--data", "ml-100k", "--pairs", "pairs.jsonl", "--out", "out", "--mode",
     "no-behavior", "--ray", f"ray://user:{PLANTED}@127.0.0.1:1"],
    ["--mlflow", f"http://user:{PLANTED}@127.0.0.1:9", "judge", "--data", "ml-100k",
     "--pairs", "pairs.jsonl", "--out", "out", "--mode", "no-behavior"],
])  # fmt: skip
def test_a_planted_password_is_in_no_output_and_nothing_is_written(tmp_path, pairs, args):
    r = run_cli(*args, cwd=tmp_path)
    assert r.code == 2 and "Traceback" not in r.stderr
    assert PLANTED not in r.stdout + r.stderr
    assert "***@" in r.stderr or "credentials" in r.stderr
    assert not (tmp_path / "out").exists()
    assert _files_hold(tmp_path, PLANTED) == []


def test_a_server_url_with_credentials_is_refused_by_the_config():
    with pytest.raises(ValidationError) as e:
        LLMConfig(backend="openai-compatible", base_url=f"https://u:{PLANTED}@x/v1")
    assert PLANTED not in str(e.value) and "RECJUDGE_API_KEY" in str(e.value)
    assert LLMConfig(backend="openai-compatible", base_url="https://x:8000/v1").base_url


def test_every_cli_error_line_is_redacted(capsys):
    with pytest.raises(typer.Exit):
        fail(f"cannot reach ray://admin:{PLANTED}@head:10001 nor https://{PLANTED}@x/v1")
    err = capsys.readouterr().err
    assert PLANTED not in err and "ray://admin:***@head:10001" in err and "https://***@x" in err
