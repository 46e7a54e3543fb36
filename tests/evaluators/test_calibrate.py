"""Judge calibration against labels: metrics by hand, the isotonic map on a miscalibrated
judge, bad label and map files, and the command end to end on an impute folder."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cli_in_process import run_cli
from judged_folders import write_judged_folder
from recjudge.data import DataError
from recjudge.evaluators.offline._calibrate import (
    apply_map,
    calibrate,
    cohen_kappa,
    ece,
    fit_isotonic,
    load_map,
    read_labels,
)
from recjudge.evaluators.offline._evaluation import read_judged
from recjudge.evaluators.offline._impute import _write_sidecar


def test_ece_and_kappa_by_hand():
    p = np.array([0.05, 0.05, 0.95, 0.95])
    y = np.array([0.0, 1.0, 1.0, 1.0])
    # two bins: |0.05 - 0.5| * 1/2 + |0.95 - 1| * 1/2
    assert ece(p, y) == pytest.approx(0.5 * 0.45 + 0.5 * 0.05)
    a, b = np.array([1, 1, 0, 0]), np.array([1, 0, 0, 0])
    # p_o = 3/4, p_e = 1/2 * 1/4 + 1/2 * 3/4 = 1/2 -> kappa = 1/2
    assert cohen_kappa(a, b) == pytest.approx(0.5)
    assert cohen_kappa(np.ones(3, int), np.ones(3, int)) is None  # chance agreement 1


def test_the_isotonic_map_is_monotone_and_fixes_a_miscalibrated_judge():
    g = np.random.default_rng(0)
    truth = g.random(3000)
    y = (g.random(3000) < truth).astype(float)
    p = truth**3  # ranks right, probabilities far too low
    xs, ys = fit_isotonic(p, y)
    assert all(b >= a for a, b in zip(ys, ys[1:], strict=False))
    assert np.all(np.diff(apply_map(xs, ys, np.linspace(0, 1, 50))) >= 0)
    judged = {(str(i), "x"): (float(p[i]), bool(p[i] > 0.5)) for i in range(3000)}
    labels = {(str(i), "x"): int(y[i]) for i in range(3000)}
    r = calibrate(judged, labels, {"model": "m", "mode": "brief"}, folds=5)
    assert r["pairs"] == 3000 and 0.7 < r["auc"] <= 1.0
    assert r["cross_fitted"]["ece"] < r["ece"] / 2  # out-of-fold, not on the fitted pairs
    assert r["cross_fitted"]["brier"] < r["brier"]


def test_too_few_or_one_class_labels_are_refused():
    judged = {(str(i), "x"): (0.5, True) for i in range(20)}
    with pytest.raises(ValueError, match="only 3 labelled pairs"):
        calibrate(judged, {(str(i), "x"): 1 for i in range(3)}, {})
    with pytest.raises(ValueError, match="both classes"):
        calibrate(judged, {(str(i), "x"): 1 for i in range(20)}, {})


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("user_id,item_id,label\nu,a,1\nu,b,2\n", r"l.csv, row 2, field 'label'"),
        ("user_id,item_id,label\nu,a,yes\n", r"l.csv, row 1, field 'label'"),
        ("user_id,item,label\nu,a,1\n", r"no item_id column"),
    ],
)
def test_bad_labels_name_the_file_and_row(tmp_path, text, match):
    (tmp_path / "l.csv").write_text(text)
    with pytest.raises(DataError, match=match):
        read_labels(tmp_path / "l.csv")


def test_a_map_made_for_another_judge_is_refused(tmp_path):
    good = {"format": "recjudge-calibration", "judge": {"model": "m", "mode": "brief"},
            "map": {"x": [0.0, 1.0], "y": [0.1, 0.9]}}  # fmt: skip
    (tmp_path / "c.json").write_text(json.dumps(good))
    assert load_map(tmp_path / "c.json", {"model": "m", "mode": "brief"}) == ([0, 1], [0.1, 0.9])
    with pytest.raises(DataError, match=r"c.json, field 'mode': made for a judge with mode="):
        load_map(tmp_path / "c.json", {"model": "m", "mode": "zero-shot"})
    (tmp_path / "d.json").write_text(json.dumps({**good, "map": {"x": [0, 1], "y": [0.9, 0.1]}}))
    with pytest.raises(DataError, match="non-decreasing"):
        load_map(tmp_path / "d.json", {})
    (tmp_path / "e.json").write_text("{}")
    with pytest.raises(DataError, match="not a calibration file"):
        load_map(tmp_path / "e.json", {})


def test_calibrate_command_writes_the_map_that_impute_applies(tmp_path):
    folder = tmp_path / "imputed"
    judged = write_judged_folder(folder, tmp_path / "labels.csv", 200, seed=1, power=2.0)
    r = run_cli("calibrate", "--judgments", str(folder), "--labels", str(tmp_path / "labels.csv"),
                "--out", str(tmp_path / "cal"), "--json")  # fmt: skip
    assert r.code == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["pairs"] == 200 and got["judge"] == {"model": "m", "mode": "brief"}
    for name in ("calibration.json", "report.md", "reliability.png"):
        assert (tmp_path / "cal" / name).stat().st_size > 0
    cmap = load_map(tmp_path / "cal/calibration.json", {"model": "m", "mode": "brief"})
    _write_sidecar(folder / "imputed.jsonl", judged, [], cmap)  # what impute --calibration does
    cal, raw = read_judged(folder / "imputed.jsonl"), read_judged(folder / "imputed.jsonl", True)
    assert raw[("u0", "i0")][0] == pytest.approx(judged[0].p_yes)
    assert cal[("u0", "i0")][0] == pytest.approx(float(apply_map(*cmap, judged[0].p_yes)))
    r = run_cli("calibrate", "--judgments", str(tmp_path), "--labels", str(tmp_path / "labels.csv"),
                "--out", str(tmp_path / "cal2"))  # fmt: skip
    assert r.code == 2 and "no summary.json" in r.stderr and "recjudge impute" in r.stderr
