"""Issue 111, credentials: a secret planted in every shape an address can carry it (userinfo
with ``@`` and ``:`` in the password, a query token, a fragment, a bare token, a schemeless
Ray address, the environment variable) for every option that takes an address appears in no
output: stdout, stderr, any file the run writes. One redaction (``_util.redact_uri``, parsed
with ``urllib.parse``) serves them all."""

from __future__ import annotations

import warnings

import pytest
from test_secrets_round5 import _files_hold, pairs  # noqa: F401 - pairs is a fixture

from cli_in_process import run_cli
from recjudge._util import redact_secrets, redact_uri, uri_secrets
from recjudge.cli._app import _show_warning
from recjudge.reporting._mlflow import MAX_KEY, report_metrics, report_tags

S = "PLANTEDsecret6"

SHAPES = {
    "userinfo with @ and :": f"http://user:p@ss:{S}@127.0.0.1:9",
    "query token": f"http://127.0.0.1:9/?token={S}&x=1",
    "fragment": f"http://127.0.0.1:9/#access_token={S}",
    "bare token": f"https://{S}@127.0.0.1:9",
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_redact_uri_hides_each_shape_whole(shape):
    text = f"cannot use {SHAPES[shape]} (retried: {SHAPES[shape]})."
    got = redact_uri(text)
    assert S not in got and "p@ss" not in got
    assert "127.0.0.1:9" in got  # the host stays readable


def test_redact_uri_leaves_what_is_not_an_address_alone():
    text = "unknown metric 'ndcg@5'; e.g. precision@10: k=10, write to user@example.com"
    assert redact_uri(text) == text


def test_a_schemeless_ray_address_and_a_query_quoted_without_its_host():
    assert (
        redact_uri(f"--ray user:{S}@127.0.0.1:1: nothing") == "--ray user:***@127.0.0.1:1: nothing"
    )
    assert redact_uri(f"--ray {S}@10.1.2.3:6379") == "--ray ***@10.1.2.3:6379"
    assert S not in redact_uri(f"Max retries exceeded with url: /?token={S}/api/2.0/x")


def test_the_secret_parts_of_a_uri_are_removed_in_any_shape_a_library_quotes_them():
    uri = f"http://user:{S}@host:5000/?key=K3Y-{S}#frag-{S}"
    assert set(uri_secrets(uri)) == {S, f"K3Y-{S}", f"frag-{S}"}
    assert S not in redact_secrets(f"failed for user={S!r} at {uri}", uri)


def test_a_warning_prints_one_line_without_a_path_or_a_secret(capsys):
    _show_warning(warnings.WarningMessage(f"cannot reach http://u:{S}@h:1", UserWarning,
                                          "/opt/site-packages/lib/x.py", 7).message,
                  UserWarning, "/opt/site-packages/lib/x.py", 7)  # fmt: skip
    err = capsys.readouterr().err
    assert err.startswith("warning: UserWarning: cannot reach http://u:***@h:1")
    assert "site-packages" not in err and S not in err


JUDGE = ["judge", "--data", "ml-100k", "--pairs", "pairs.jsonl", "--out", "out", "--mode",
         "no-behavior"]  # fmt: skip
CASES = [
    *[(f"--mlflow {shape}", ["--mlflow", uri, *JUDGE], {}) for shape, uri in SHAPES.items()],
    *[(f"--server {shape}", ["--server", uri.replace(":9", ":9/v1"), *JUDGE], {})
      for shape, uri in SHAPES.items()],
    ("--ray schemeless userinfo", [*JUDGE, "--ray", f"user:{S}@127.0.0.1:1"], {}),
    ("--ray scheme and @ in the password", [*JUDGE, "--ray", f"ray://u:p@{S}@127.0.0.1:1"], {}),
    ("RECJUDGE_MLFLOW_URI", JUDGE, {"RECJUDGE_MLFLOW_URI": SHAPES["userinfo with @ and :"]}),
]  # fmt: skip


@pytest.mark.usefixtures("pairs")
@pytest.mark.parametrize(("case", "args", "env"), CASES, ids=[c[0] for c in CASES])
def test_a_planted_secret_is_in_no_output(tmp_path, case, args, env):
    r = run_cli(*args, cwd=tmp_path, env=env)
    assert r.code != 0 and "Traceback" not in r.stderr, (case, r.stderr[-1500:])
    assert S not in r.stdout + r.stderr, (case, r.stderr[-1500:])
    assert _files_hold(tmp_path, S) == [], case


def test_long_system_names_keep_distinct_mlflow_keys_and_say_so():
    """Issue 111: six keys cut at 250 characters overwrote each other; now each long key ends
    in a hash of the whole name, and the tags say how many were shortened."""
    long = "system-" * 50
    res = {"scores": {"logged": {f"{long}A": {"ndcg@10": 0.1}, f"{long}B": {"ndcg@10": 0.2}}},
           "intervals": {}}  # fmt: skip
    got = report_metrics(res)
    assert len(got) == 2 and sorted(got.values()) == [0.1, 0.2]
    assert all(len(k) == MAX_KEY and "~" in k for k in got)
    assert report_tags(res, "t")["recjudge.shortened_keys"].startswith("2 metric keys")
    short = {"scores": {"logged": {"a": {"ndcg@10": 0.1}}}, "intervals": {}}
    assert "recjudge.shortened_keys" not in report_tags(short, "t")
