"""``recjudge report latex``: systems x metrics with intervals, best value bold, the
estimator named, untrusted names escaped; CSV with the same rows."""

from __future__ import annotations

import csv
import io
import json
import re

import pytest

from cli_in_process import run_cli
from recjudge.reporting import latex_escape, paper_table, to_csv, to_latex

ESTIMATED = {
    "estimators": {
        "lead": {"estimator": "snips"},
        "systems": {
            "als": {"ndcg_fixed@10": {"snips": {"value": 0.21, "ci": [0.18, 0.24]},
                                      "dr": {"value": 0.25, "ci": [0.2, 0.3]}}},
            "pop_&_50%": {"ndcg_fixed@10": {"snips": {"value": 0.30, "ci": [0.26, 0.35]},
                                            "dr": {"value": 0.1, "ci": None}}},
        },
    }
}  # fmt: skip


def test_latex_names_the_lead_estimator_bolds_the_best_and_escapes_names():
    t = paper_table(ESTIMATED)
    assert t.source.startswith("estimator snips")
    tex = to_latex(t)
    assert r"pop\_\&\_50\%" in tex and "pop_&" not in tex
    assert r"\textbf{0.300} {\scriptsize [0.260, 0.350]}" in tex
    assert r"0.210 {\scriptsize [0.180, 0.240]}" in tex and r"\textbf{0.210}" not in tex
    assert "estimator snips" in tex and r"\begin{tabular}{lc}" in tex
    dr = to_latex(paper_table(ESTIMATED, estimator="dr"))
    # no interval on pop's dr: nothing separates als from it, so nothing is bold
    assert r"\textbf{0.250}" not in dr and "0.100 \\\\" in dr  # no interval: the value alone


def test_a_best_whose_interval_overlaps_another_is_not_bold():
    overlap = {"estimators": {"lead": {"estimator": "snips"}, "systems": {
        "a": {"p@10": {"snips": {"value": 0.30, "ci": [0.20, 0.40]}}},
        "b": {"p@10": {"snips": {"value": 0.28, "ci": [0.19, 0.37]}}}}}}  # fmt: skip
    assert r"\textbf" not in to_latex(paper_table(overlap))


def test_csv_has_the_same_rows():
    t = paper_table(ESTIMATED, estimator="dr")
    rows = list(csv.DictReader(io.StringIO(to_csv(t))))
    assert [(r["system"], float(r["value"])) for r in rows] == [("als", 0.25), ("pop_&_50%", 0.1)]
    assert rows[1]["lo"] == "" and rows[0]["source"] == "estimator dr"


def test_wrong_requests_say_what_the_report_has():
    with pytest.raises(ValueError, match="'ips' is not in this report; it has dr, snips"):
        paper_table(ESTIMATED, estimator="ips")
    with pytest.raises(ValueError, match="no systems x metrics table"):
        paper_table({"summary": {}})
    scores = {"scores": {"logged": {"a": {"p@1": 0.5}}}, "intervals": {}}
    with pytest.raises(ValueError, match="has no estimators"):
        paper_table(scores, estimator="dr")
    assert paper_table(scores).rows == [("a", "p@1", 0.5, None, None)]
    assert (
        latex_escape("a\\b{c}~^\x07")
        == r"a\textbackslash{}b\{c\}\textasciitilde{}\textasciicircum{}"
    )


def test_the_command_reads_a_report_folder(tmp_path):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "results.json").write_text(json.dumps(ESTIMATED))
    r = run_cli("report", "latex", str(tmp_path / "r"))
    assert r.code == 0 and r"\begin{table}" in r.stdout and "estimator snips" in r.stdout
    r = run_cli("report", "latex", str(tmp_path / "r"), "--format", "csv", "--out",
                str(tmp_path / "t.csv"))  # fmt: skip
    assert r.code == 0 and (tmp_path / "t.csv").read_text().startswith("system,metric")
    r = run_cli("report", "latex", str(tmp_path / "nope"))
    assert r.code == 2 and "no such file" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("report", "latex", str(tmp_path / "r"), "--format", "docx")
    assert r.code == 2 and "latex or csv" in r.stderr


def test_a_system_with_a_non_finite_value_stays_in_the_table_as_undefined():
    """Issue 91: `report latex` dropped a system whose values were NaN or infinite."""
    bad = {"estimators": {"lead": {"estimator": "snips"}, "systems": {
        "a": {"p@10": {"snips": {"value": 0.3, "ci": [0.2, 0.4]}}},
        "b": {"p@10": {"snips": {"value": float("nan"), "ci": None}}},
        "c": {"p@10": {"snips": {"value": float("inf"), "ci": None}}}}}}  # fmt: skip
    tex = to_latex(paper_table(bad))
    assert "\nb & --" in tex and "\nc & --" in tex


def test_a_system_with_non_finite_scores_stays_and_a_non_number_is_named(tmp_path):
    """Issue 111: the ranx-scores table (an evaluate without --qrels) dropped a system whose
    values were NaN or Infinity, and strings, lists or bools gave "no systems x metrics
    table" without naming the entry."""
    res = {"scores": {"logged": {"a": {"ndcg@10": 0.3}, "b": {"ndcg@10": float("nan")},
                                 "c": {"ndcg@10": float("inf")}}}}  # fmt: skip
    tex = to_latex(paper_table(res))
    assert "\nb & --" in tex and "\nc & --" in tex
    for bad, shown in (("x", "'x' (str)"), ([1, 2], "'[1, 2]' (list)"), (True, "'True' (bool)")):
        odd = {"scores": {"logged": {"a": {"ndcg@10": 0.3}, "b": {"ndcg@10": bad}}}}
        with pytest.raises(ValueError, match=r"scores\.logged\.b\.ndcg@10 is " + re.escape(shown)):
            paper_table(odd)
    (tmp_path / "results.json").write_text(json.dumps(
        {"scores": {"logged": {"a": {"ndcg@10": "x"}}}}))  # fmt: skip
    r = run_cli("report", "latex", str(tmp_path))
    assert r.code == 2 and "scores.logged.a.ndcg@10 is 'x' (str)" in r.stderr


def test_report_html_on_a_report_md_that_is_not_utf8_names_the_file(tmp_path):
    (tmp_path / "results.json").write_text(json.dumps({"scores": {}}))
    (tmp_path / "report.md").write_bytes("# Caf\xe9 report\n".encode("latin-1"))
    r = run_cli("report", "html", str(tmp_path))
    assert r.code == 2 and "Traceback" not in r.stderr
    assert "report.md: not UTF-8 text (byte 0xe9" in r.stderr and "save it as UTF-8" in r.stderr


def test_two_systems_that_render_alike_keep_two_rows():
    """Issue 111: names that differ only in control characters escaped to one LaTeX row."""
    res = {"scores": {"logged": {"a\x01": {"ndcg@10": 0.1}, "a": {"ndcg@10": 0.2}}}}
    tex = to_latex(paper_table(res))
    rows = [line for line in tex.splitlines() if line.startswith("a ")]
    assert len(rows) == 2 and len({r.split(" & ")[0] for r in rows}) == 2
    assert all(r"\#" in r for r in rows)
