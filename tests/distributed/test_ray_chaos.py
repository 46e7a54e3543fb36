"""Chaos on a local Ray cluster (issue 91, as Ray's own chaos tests do): the driver SIGKILLed
mid-run, then the cluster's raylet killed mid-run; after each, ``--resume`` (on a fresh
cluster where the old one died) finishes the run. No judgment is lost or stored twice, the
answers equal one process's, and the resumed run says how many pairs it kept and how many the
kill cost (judged again). A worker SIGKILLed mid-run is ``test_ray.py``'s.

Each scenario starts its own cluster (a dead raylet takes its cluster with it) and runs the
driver as a real process (``python -m recjudge.cli._main``), so a SIGKILL hits it as it would a
user's terminal.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from cli_in_process import run_checked
from recjudge.distributed import LocalCluster

PAIRS = [(str(u), str(i)) for u in range(1, 11) for i in range(40, 46)]  # 60 pairs
JUDGE = ["judge", "--data", "ml-100k", "--pairs", "pairs.jsonl", "--mode", "no-behavior",
         "--no-evidence", "--max-history", "5", "--batch-size", "3"]  # fmt: skip
GLOBAL = ["--dtype", "float32"]  # fp32: a worker's threads round as one process's within 1e-5


def _write_pairs(folder: Path) -> None:
    (folder / "pairs.jsonl").write_text(
        "".join(json.dumps({"user_id": u, "item_id": i}) + "\n" for u, i in PAIRS))  # fmt: skip


def _stored(store: Path) -> int:
    if not store.exists():
        return 0
    try:
        with sqlite3.connect(f"file:{store}?mode=ro", uri=True, timeout=1) as db:
            return db.execute("SELECT count(*) FROM results").fetchone()[0]
    except sqlite3.Error:
        return 0


def _answers(path: Path) -> dict[tuple[str, str], dict]:
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    return {(r["user_id"], r["candidate_id"]): r for r in rows}


def _same_as_reference(folder: Path, out: str) -> None:
    want, got = _answers(folder / "ref.jsonl"), _answers(folder / out)
    assert set(got) == set(want) == set(PAIRS)
    for k, w in want.items():
        g = got[k]
        assert g.get("error") is None and g["is_relevant"] == w["is_relevant"], k
        assert g["p_yes"] == pytest.approx(w["p_yes"], abs=1e-5), k
    store = folder / f"{out}.sqlite"
    with sqlite3.connect(store) as db:
        keys = [k for (k,) in db.execute("SELECT key FROM results")]
    assert len(keys) == len(set(keys)) == len(PAIRS)  # every pair once, none twice


def _on_ray(out: str, cluster: LocalCluster) -> list[str]:
    """The judgment's arguments on ``cluster``: 2 actors of 1 thread each."""
    return [*GLOBAL, *JUDGE, "--out", out, "--ray", cluster.address, "--ray-actors", "2",
            "--ray-threads", "1"]  # fmt: skip


def _driver(folder: Path, out: str, cluster: LocalCluster) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "recjudge.cli._main", *_on_ray(out, cluster)]
    env = {**os.environ, **cluster.env}
    return subprocess.Popen(cmd, cwd=folder, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip


def _wait_for_rows(proc: subprocess.Popen, store: Path, at_least: int, timeout: float = 600):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        n = _stored(store)
        if n >= at_least:
            return n
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the driver ended before {at_least} pairs were stored: {err[-2000:]}")
        time.sleep(0.1)
    proc.kill()
    pytest.fail(f"fewer than {at_least} pairs stored in {timeout} s")


def _resume(folder: Path, out: str, cluster: LocalCluster, kept_at_least: int) -> str:
    r = run_checked(*_on_ray(out, cluster), "--resume", cwd=folder, env=cluster.env)
    line = r.stdout.strip().splitlines()[-1]
    m = re.search(r"(\d+) from the store, (\d+) judged now", line)
    kept, now = int(m.group(1)), int(m.group(2))
    assert kept_at_least <= kept < len(PAIRS) and kept + now == len(PAIRS), line
    return line


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The pairs and the one-process reference answers (no cluster)."""
    f = tmp_path_factory.mktemp("chaos")
    _write_pairs(f)
    run_checked(*GLOBAL, *JUDGE, "--out", "ref.jsonl", cwd=f)
    return f


@pytest.mark.ray
@pytest.mark.model
def test_a_driver_killed_mid_run_loses_nothing_after_resume(folder):
    with LocalCluster(cpus=2, temp_dir=f"/tmp/rj-chaos-{os.getpid()}") as c:
        proc = _driver(folder, "driver.jsonl", c)
        stored = _wait_for_rows(proc, folder / "driver.jsonl.sqlite", 6)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        assert stored < len(PAIRS) and not (folder / "driver.jsonl").exists()
        line = _resume(folder, "driver.jsonl", c, stored)
    print(f"driver SIGKILLed with {stored} pairs stored; resumed: {line}")
    _same_as_reference(folder, "driver.jsonl")


@pytest.mark.ray
@pytest.mark.model
def test_a_raylet_killed_mid_run_ends_the_run_and_resume_on_a_new_cluster_loses_nothing(
    folder,
):
    with LocalCluster(cpus=2, temp_dir=f"/tmp/rj-chaos-{os.getpid()}") as c:
        proc = _driver(folder, "raylet.jsonl", c)
        stored = _wait_for_rows(proc, folder / "raylet.jsonl.sqlite", 6)
        raylets = [p for p in map(psutil.Process, c.pids()) if p.name() == "raylet"]
        assert raylets, "no raylet process in the cluster"
        for p in raylets:
            p.kill()
        try:
            _, err = proc.communicate(timeout=300)  # the driver must end by itself
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail("the driver hung after its cluster's raylet died")
        assert proc.returncode != 0 and "Traceback" not in err[-3000:], err[-3000:]
    with LocalCluster(cpus=2, temp_dir=f"/tmp/rj-chaos-{os.getpid()}") as fresh:
        line = _resume(folder, "raylet.jsonl", fresh, stored)
    print(f"raylet killed with {stored} pairs stored; resumed on a new cluster: {line}")
    _same_as_reference(folder, "raylet.jsonl")
