"""MLflow tracking of a report against a local folder store in a temporary folder (no
server, no network): params, every number with its interval bounds, the report files, the
judge's identity; a resumed job logs to the same run; the API key is never logged."""

from __future__ import annotations

import json
import os

import pytest
from report_world import write_toy_world

from cli_in_process import run_cli
from recjudge._util import redact_uri

mlflow = pytest.importorskip("mlflow")


def _client(uri):
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


@pytest.fixture
def folder(tmp_path):
    return write_toy_world(tmp_path, users=10)


def _evaluate(folder, uri, *extra, env=None):
    return run_cli("--mlflow", uri, "evaluate", "--runs",
                   f"a={folder}/a.jsonl,b={folder}/b.jsonl", "--feedback", str(folder / "ds"),
                   "--k", "5", "--metrics", "ndcg@5,precision@5", "--min-rating", "3", "--out",
                   str(folder / "ev"), *extra, env=env)  # fmt: skip


def test_an_evaluate_report_is_logged_with_every_interval_and_resumes_its_run(folder):
    uri = (folder / "mlruns").as_uri()
    secret = "sekret-key-12345"
    r = _evaluate(folder, uri, "--note", f"key {secret}", env={"RECJUDGE_API_KEY": secret})
    assert r.code == 0, r.stderr
    results = json.loads((folder / "ev" / "results.json").read_text())
    client = _client(uri)
    exp = client.get_experiment_by_name("recjudge")
    (run,) = client.search_runs([exp.experiment_id])
    m = run.data.metrics
    for kind, by_sys in results["scores"].items():
        for system, by_m in by_sys.items():
            for metric, v in by_m.items():
                name = f"{kind}.{system}.{metric}".replace("@", "_")
                lo, hi = results["intervals"][kind][system][metric]
                assert (m[name], m[f"{name}.lo"], m[f"{name}.hi"]) == pytest.approx((v, lo, hi))
    assert run.data.params["k"] == "5"
    assert run.data.tags["recjudge.version"]
    assert secret not in json.dumps(run.data.params) + json.dumps(run.data.tags)
    assert "[redacted]" in run.data.params["note"]
    arts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"report.md", "report.html", "results.json", "evaluate.png"} <= arts
    # the same job again into the same folder: the same run, a second step
    assert _evaluate(folder, uri, "--note", f"key {secret}",
                     env={"RECJUDGE_API_KEY": secret}).code == 0  # fmt: skip
    (again,) = client.search_runs([exp.experiment_id])
    assert again.info.run_id == run.info.run_id
    key = next(iter(m))
    assert [x.step for x in client.get_metric_history(run.info.run_id, key)] == [0, 1]


def test_a_tracking_uri_that_does_not_work_is_one_line(folder):
    r = _evaluate(folder, "nosuchscheme://nowhere/x")
    assert r.code == 2 and "Traceback" not in r.stderr
    assert "tracking URI" in r.stderr and "file:///" in r.stderr


def test_a_password_in_the_uri_is_never_printed_and_the_uri_is_checked_before_the_job(folder):
    """Issue 91: the password was printed twice in the error line, after the whole job."""
    r = _evaluate(folder, "http://user:PLANTEDPW@127.0.0.1:9")
    assert r.code == 2 and "Traceback" not in r.stderr
    assert "PLANTEDPW" not in r.stderr + r.stdout and "user:***@127.0.0.1:9" in r.stderr
    assert not (folder / "ev").exists()  # refused before the job wrote anything


def test_redact_uri_hides_passwords_and_tokens_in_any_uri():
    text = "a http://u:pw1234@h:9/x b postgresql://v:p%40ss@db/m c https://tok@h.org d file:///x"
    got = redact_uri(text)
    assert "pw1234" not in got and "p%40ss" not in got and "tok@" not in got
    assert "http://u:***@h:9/x" in got and "https://***@h.org" in got and "file:///x" in got
