"""MLflow tracking of a report (``recjudge[mlflow]``; ``--mlflow URI`` or
``$RECJUDGE_MLFLOW_URI``).

Every report ``write_report`` writes (the jobs' and the benchmarks') is logged when a tracking
URI is set: the config as params, every number with its interval bounds as metrics (an
``evaluate`` report's metrics per qrels kind and system, and its estimators, as ``NAME``,
``NAME.lo``, ``NAME.hi``; other reports: their numeric results, flattened), the report files
as artefacts (report.md, report.html, results.json, the PNGs) and the judge's identity as
tags (model, mode, beta, sigma source, dtype, prompt / result-key version, recjudge version).

A report folder remembers its MLflow run (``mlflow_run.json``: tracking URI and run id), so
a resumed job (the same ``--out``) logs to the same run: params already there are kept,
metrics get a new step. Any local tracking store works (``file:///path/mlruns`` or a SQLite
URI); nothing is sent anywhere unless the URI is a server. Secrets never leave: params and
tags pass through ``redact`` with ``$RECJUDGE_API_KEY``, and no environment variable is
logged.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from recjudge import __version__
from recjudge._util import (
    UserFacingError,
    atomic_write_json,
    first_line,
    json_loads,
    redact,
    redact_secrets,
    redact_uri,
)
from recjudge.reporting._results import estimates_grid, finite, scores_grid

__all__ = ["ENV_URI", "TrackingError", "check_tracking", "log_report", "tracking_uri"]

ENV_URI = "RECJUDGE_MLFLOW_URI"
ENV_EXPERIMENT = "RECJUDGE_MLFLOW_EXPERIMENT"
RUN_FILE = "mlflow_run.json"
#: MLflow limits (its FileStore and REST API refuse longer values)
MAX_PARAM, MAX_METRICS = 6000, 2000
_KEY = re.compile(r"[^A-Za-z0-9_\-. /]")
TAG_FIELDS = ("model", "mode", "beta", "cf", "dtype", "device", "backend", "implementation")


class TrackingError(UserFacingError, ValueError):
    """MLflow is not installed, or the tracking URI does not work (named, with the fix)."""


def tracking_uri() -> str | None:
    """The tracking URI of this process (``$RECJUDGE_MLFLOW_URI``; ``--mlflow`` sets it)."""
    return os.environ.get(ENV_URI) or None


#: MLflow's longest metric, param and tag key
MAX_KEY = 250


def _key(name: str) -> str:
    """An MLflow-safe metric or param name (``@`` and other characters become ``_``), unique
    by construction: a name longer than ``MAX_KEY`` keeps its head and ends in ``~`` and the
    first 10 hex digits of the sha256 of the whole name (two long system names that share
    their first 250 characters no longer map to one key and overwrite each other)."""
    safe = _KEY.sub("_", name)
    if len(safe) <= MAX_KEY:
        return safe
    digest = hashlib.sha256(name.encode("utf-8")).hexdigest()[:10]
    return f"{safe[: MAX_KEY - 11]}~{digest}"


def shortened_keys(metrics: Mapping[str, float]) -> int:
    """How many of the metric keys (``report_metrics``) ``_key`` had to shorten."""
    return sum(1 for k in metrics if "~" in k and len(k) == MAX_KEY)


def _flatten(d: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(d, Mapping):
        for k, v in d.items():
            yield from _flatten(v, f"{prefix}.{k}" if prefix else str(k))
    else:
        yield prefix, d


def _with_interval(out: dict[str, float], name: str, v: Any, lo: Any, hi: Any) -> None:
    """``name`` and its interval's bounds (``.lo``, ``.hi``), each where it is a number."""
    for suffix, x in (("", v), (".lo", lo), (".hi", hi)):
        if x is not None:
            out[_key(f"{name}{suffix}")] = float(x)


def report_metrics(results: Mapping[str, Any]) -> dict[str, float]:
    """The numbers to log: an evaluate report's scores and estimators with their intervals
    (``.lo`` / ``.hi``), else every finite number of the results (the environment aside),
    at most ``MAX_METRICS``."""
    out: dict[str, float] = {}
    for m, v in (results.get("verdicts") or {}).items():  # the answer first
        for r in v.get("rows") or []:
            ci = r.get("ci") or (None, None)
            _with_interval(out, f"verdict.{m}.{r['a']} - {r['b']}", r.get("value"), *ci)
    for kind, system, m, v, lo, hi in scores_grid(results):
        _with_interval(out, f"{kind}.{system}.{m}", v, lo, hi)
    for system, m, e, v, lo, hi in estimates_grid(results):
        _with_interval(out, f"estimate.{e}.{system}.{m}", v, lo, hi)
    if not out:
        for k, v in _flatten({k: v for k, v in results.items()
                              if k not in ("environment", "config", "job")}):  # fmt: skip
            if finite(v) is not None:
                out[_key(k)] = float(v)
            if len(out) >= MAX_METRICS:
                break
    return dict(list(out.items())[:MAX_METRICS])


def _config(results: Mapping[str, Any]) -> dict[str, Any]:
    for part in ("job", "config"):
        if isinstance(results.get(part), Mapping):
            return dict(results[part])
    return {}


def report_params(results: Mapping[str, Any]) -> dict[str, str]:
    """The config (``job`` or ``config`` of the results) flattened, values as text."""
    secret = os.environ.get("RECJUDGE_API_KEY")
    out = {}
    for k, v in _flatten(_config(results)):
        text = v if isinstance(v, str) else repr(v)
        out[_key(k)] = redact(text, secret)[:MAX_PARAM]
    return out


def report_tags(results: Mapping[str, Any], title: str,
                metrics: Mapping[str, float] | None = None) -> dict[str, str]:  # fmt: skip
    """The judge's identity and what produced the report; ``metrics``: ``report_metrics``'s,
    when the caller has them (else computed here), for the count of shortened keys."""
    tags = {"recjudge.version": __version__, "recjudge.report": title[:250]}
    for part in ("judge", "job", "config"):
        d = results.get(part)
        if isinstance(d, Mapping):
            for k in TAG_FIELDS:
                if d.get(k) not in (None, "") and f"judge.{k}" not in tags:
                    tags[f"judge.{k}"] = str(d[k])
    if results.get("prompt_version"):
        tags["judge.result_key_version"] = str(results["prompt_version"])
    for m, v in (results.get("verdicts") or {}).items():  # one sentence per metric and pair
        if isinstance(v, Mapping):
            tags[f"verdict.{_key(m)}"] = (f"{v.get('estimator')}: " + "; ".join(
                str(r.get("text")) for r in v.get("rows") or []))  # fmt: skip
    sigma = results.get("sigma_source") or (results.get("judge") or {}).get("cf")
    if sigma:
        tags["judge.sigma_source"] = str(sigma.get("folder", sigma) if isinstance(sigma, Mapping)
                                         else sigma)  # fmt: skip
    short = shortened_keys(report_metrics(results) if metrics is None else metrics)
    if short:
        tags["recjudge.shortened_keys"] = (
            f"{short} metric keys were longer than MLflow's {MAX_KEY} characters (long system "
            "names): each keeps its head and ends in ~ and a hash of the whole name; "
            "results.json holds the full names")  # fmt: skip
    env = results.get("environment") or {}
    if isinstance(env, Mapping) and env.get("cpu"):
        tags["machine.cpu"] = str(env["cpu"])
    secret = os.environ.get("RECJUDGE_API_KEY")
    return {k: redact(v, secret)[:5000] for k, v in tags.items()}


def _mlflow() -> Any:
    try:
        import mlflow
    except ImportError:
        raise TrackingError(
            f"${ENV_URI} / --mlflow is set but MLflow is not installed here; install it "
            "(pip install 'recjudge[mlflow]'), or unset it"
        ) from None
    return mlflow


def _resumed_run(client: Any, memo: Path, uri: str, mlflow: Any) -> str | None:
    """The run a report folder logged to before (``mlflow_run.json``), if it is in this
    tracking store still; None: start one."""
    try:
        saved = json_loads(memo.read_text(encoding="utf-8")) if memo.is_file() else {}
        if isinstance(saved, dict) and saved.get("tracking_uri") == redact_uri(uri):
            return client.get_run(str(saved.get("run_id"))).info.run_id
    except (OSError, ValueError, json.JSONDecodeError, mlflow.exceptions.MlflowException):
        pass  # no run to resume there
    return None


def _client(uri: str) -> tuple[Any, Any]:
    """An MLflow client on ``uri`` whose store opened, and the mlflow module.

    Raises:
        TrackingError: MLflow missing, or the store does not open (the URI's password
            redacted in the message).
    """
    if "://" not in uri or uri.startswith("file:"):
        # A local folder store: MLflow 3 keeps it in maintenance mode behind an opt-in; a
        # user who names a folder has opted in (a database URI needs mlflow's SQL extras).
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    mlflow = _mlflow()
    from mlflow.tracking import MlflowClient

    # the first contact is a check: a server that does not answer is said at once, not after
    # MLflow's default retries with backoff (minutes); a user's own settings win
    quick = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "15"}
    saved = {k: os.environ.get(k) for k in quick}
    for k, v in quick.items():
        os.environ.setdefault(k, v)
    try:
        client = MlflowClient(tracking_uri=uri)
        client.search_experiments(max_results=1)  # the store opens (or says why not)
    except (mlflow.exceptions.MlflowException, ImportError, OSError) as e:
        why = redact_secrets(first_line(e), uri)[:200]  # whole first: a cut could split one
        raise TrackingError(
            f"MLflow cannot use the tracking URI {redact_uri(uri)} ({why}); give a local "
            "folder (file:///path/mlruns) or a server's http(s) URL"
        ) from None
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return client, mlflow


def check_tracking(uri: str) -> None:
    """Open the tracking store now, before a job runs (a bad URI is said in one line at the
    start, not after the job).

    Raises:
        TrackingError: as ``_client``.
    """
    _client(uri)


def log_report(out: str | Path, results: Mapping[str, Any], title: str,
               uri: str | None = None) -> str | None:  # fmt: skip
    """Log the report folder ``out`` to MLflow (module docstring); the run id, or None
    without a tracking URI.

    Raises:
        TrackingError: MLflow missing, or the tracking store refused the run.
    """

    uri = uri or tracking_uri()
    if not uri:
        return None
    client, mlflow = _client(uri)
    out = Path(out)
    memo = out / RUN_FILE
    run_id = _resumed_run(client, memo, uri, mlflow)
    try:
        if run_id is None:
            name = os.environ.get(ENV_EXPERIMENT) or "recjudge"
            exp = client.get_experiment_by_name(name)
            exp_id = exp.experiment_id if exp else client.create_experiment(name)
            run_id = client.create_run(exp_id, run_name=out.name or title[:60]).info.run_id
            # the folder is shared: the URI's password never goes into it
            atomic_write_json(memo, {"tracking_uri": redact_uri(uri), "run_id": run_id})
        have = client.get_run(run_id).data
        step = 1 + max((m.step for k in list(have.metrics)[:1]
                        for m in client.get_metric_history(run_id, k)), default=-1)  # fmt: skip
        params = {k: v for k, v in report_params(results).items() if k not in have.params}
        from mlflow.entities import Metric, Param, RunTag

        now = int(time.time() * 1000)
        values = report_metrics(results)
        metrics = [Metric(k, v, now, step) for k, v in values.items()]
        tags = [RunTag(k, v) for k, v in report_tags(results, title, values).items()]
        plist = [Param(k, v) for k, v in params.items()]
        for i in range(0, max(len(metrics), len(plist), 1), 100):  # the REST API's batch limit
            client.log_batch(run_id, metrics=metrics[i:i + 100], params=plist[i:i + 100],
                             tags=tags if i == 0 else [])  # fmt: skip
        for name in ("report.md", "report.html", "results.json", *sorted(
                p.name for p in out.glob("*.png"))):  # fmt: skip
            if (out / name).is_file():
                client.log_artifact(run_id, str(out / name))
    except mlflow.exceptions.MlflowException as e:
        raise TrackingError(f"MLflow at {redact_uri(uri)} refused the run "
                            f"({redact_secrets(first_line(e), uri)[:200]})"
                            "; check the URI (e.g. file:///path/mlruns or sqlite:///mlflow.db)"
                            ) from None  # fmt: skip
    return run_id
