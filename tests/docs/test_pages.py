"""The docs pages' blocks run as written, at small size: the tutorial of ``evaluate.md`` in
bash (its two blocks, with the gold labels filled in between as a person would), then the
two Python blocks of ``python.md`` in the folder the tutorial left.

Small size is the same text with these substitutions and nothing else: the embedded SmolLM2
for the 0.5B, 3 users (2 in Python) for 30, 6 gold pairs for 60.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _blocks import DOCS, block

SMALL = [
    ("qwen2.5-coder-0.5b", "smollm2-135m"),
    ("--users 30", "--users 3"),
    ("--n 60", "--n 6"),
    ("users=200", "users=2"),
]


def small(text: str) -> str:
    for a, b in SMALL:
        text = text.replace(a, b)
    return text


def _bash(text: str, cwd: Path) -> str:
    recjudge = Path(sys.executable).with_name("recjudge")
    script = "set -euo pipefail\n" + small(text).replace(
        "R=.venv/bin/recjudge", f"R={recjudge}")  # fmt: skip
    if "R=" not in text:
        script = f"R={recjudge}\n{script}"
    r = subprocess.run(["bash", "-c", script], cwd=cwd, capture_output=True, text=True,
                       timeout=1800, env=os.environ.copy(), check=False)  # fmt: skip
    assert r.returncode == 0, f"{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    return r.stdout


def _last_json(out: str) -> dict:
    """The JSON object a block's last command printed (after the other commands' text)."""
    return json.loads(out[out.rindex("\n{") + 1 :])


def _label(cwd: Path) -> int:
    """Fill gold.csv's empty label column as the judge's imputed qrels say (a stand-in for a
    person; the test is about the commands, not the labels)."""
    q = json.loads((cwd / "imputed/qrels_imputed.json").read_text())
    with open(cwd / "gold.csv", newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        fields, rows = reader.fieldnames, list(reader)
    assert fields and "label" in fields and rows and all(r["label"] == "" for r in rows)
    for r in rows:
        r["label"] = str(int(q.get(r["user_id"], {}).get(r["item_id"], 0) > 0))
    with open(cwd / "gold.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    return len(rows)


@pytest.mark.e2e
@pytest.mark.model
def test_the_tutorial_page_runs_then_the_python_page_in_its_folder(tmp_path):
    first = block(DOCS / "evaluate.md", "The whole flow", 0, "bash")
    second = block(DOCS / "evaluate.md", "The whole flow", 1, "bash")
    assert "impute" in first.text and "gold sample" in first.text
    assert "--gold gold.csv" in second.text and "augment" in second.text
    _bash(first.text, tmp_path)
    for f in ("imputed/qrels_imputed.json", "report/report.md", "report/results.json"):
        assert (tmp_path / f).is_file(), f
    assert _label(tmp_path) > 0
    _bash(second.text, tmp_path)
    res = json.loads((tmp_path / "report/results.json").read_text())
    assert res["estimators"]["gold"].startswith("gold.csv")
    assert (tmp_path / "data/augmented").is_dir() and (tmp_path / "report_aug/report.md").is_file()

    # python.md's two blocks, one namespace, in the tutorial's folder
    ns: dict = {}
    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        for i in range(2):
            b = block(DOCS / "python.md", "Python API", i, "python")
            exec(compile(small(b.text), b.where(), "exec"), ns)
    finally:
        os.chdir(old)
    j = ns["j"]
    assert j.is_relevant in (True, False) and 0.0 <= j.p_yes <= 1.0
    assert bool(j.evidence) == bool(j.is_relevant)
    assert ns["summary"]["users"] == 2 and ns["summary"]["pairs"] > 0
    assert ns["res"]  # evaluate_runs' scores for both runs


@pytest.mark.e2e
@pytest.mark.model
def test_the_profiles_first_run_runs_as_written(tmp_path):
    b = block(DOCS / "profiles.md", "A first run", 0, "bash")
    assert "gist example-profiles" in b.text and "gist verify" in b.text
    out = _bash(b.text, tmp_path)
    scores = _last_json(out)
    assert set(scores) == {"genres", "popular"}
    res = json.loads((tmp_path / "reports/my-profiles/results.json").read_text())
    assert res["user_sample"]["users"] == 3 and len(res["users"]) == 3
    assert (tmp_path / "reports/my-profiles/report.md").is_file()


@pytest.mark.e2e
def test_the_export_for_other_libraries_runs_as_written(tmp_path):
    b = block(DOCS / "models.md", "Export a dataset or a split", 0, "bash")
    _bash(b.text, tmp_path)
    header = (tmp_path / "export/recbole/past/past.inter").read_text().split("\n", 1)[0]
    assert header.startswith("user_id:token\titem_id:token")
    cols = (tmp_path / "export/past/interactions.csv").read_text().split("\n", 1)[0].split(",")
    assert {"user_id", "item_id", "rating", "timestamp"} <= set(cols)


@pytest.mark.e2e
@pytest.mark.model
def test_the_tune_first_run_runs_as_written(tmp_path):
    b = block(DOCS / "tune.md", "A first run", 0, "bash")
    assert "judge tune" in b.text
    out = _bash(b.text, tmp_path)
    card = json.loads((tmp_path / "runs/judge-tuned/recjudge-tuned.json").read_text())
    assert card["base_model"] == "smollm2-135m" and card["steps"] <= 4
    got = _last_json(out)
    assert got["is_relevant"] in (True, False) and 0.0 <= got["p_yes"] <= 1.0


@pytest.mark.e2e
@pytest.mark.model
def test_the_augment_first_run_runs_as_written(tmp_path):
    b = block(DOCS / "augment.md", "A first run", 0, "bash")
    assert "augment" in b.text and "--users 30" in b.text
    _bash(b.text, tmp_path)
    assert (tmp_path / "data/augmented").is_dir()
    res = json.loads((tmp_path / "report_aug/results.json").read_text())
    assert set(res["scores"]["logged"]) == {"als", "als_aug"}
