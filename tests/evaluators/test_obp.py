"""Interop with Open Bandit Pipeline: what obp's estimators computed on ``to_obp``'s arrays
(``scripts/crosscheck_obp.py`` ran obp 0.5.7 and stored its inputs and outputs; obp itself
declares Python < 3.11, so it is not in the lock) equals recjudge's own estimators on the same
lists; the exported arrays keep obp's input contract; ``export_obp`` writes archives numpy
loads without pickle, whatever the run's name."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from recjudge.evaluators.offline._estimators import ListLabels, estimate
from recjudge.evaluators.offline._obp import export_obp, to_obp
from recjudge.evaluators.offline._propensities import Propensities

REFERENCE = json.loads((Path(__file__).parent / "data" / "obp_reference.json").read_text())


def _lists(case: dict) -> dict[str, ListLabels]:
    fields = ("observed", "label", "p", "hard", "propensity")
    return {u: ListLabels(*(np.asarray(x[f], dtype=float) for f in fields))
            for u, x in case["lists"].items()}  # fmt: skip


@pytest.mark.parametrize("n", range(len(REFERENCE["cases"])))
def test_dm_ips_snips_dr_equal_obps_on_the_same_inputs(n):
    case = REFERENCE["cases"][n]
    ours = estimate(_lists(case), [case["metric"]], list(case["obp"]), draws=0)[case["metric"]]
    for est, theirs in case["obp"].items():
        assert ours[est].value == pytest.approx(theirs, rel=1e-9, abs=1e-12), est


def test_the_reference_holds_short_lists_and_every_linear_metric():
    cases = REFERENCE["cases"]
    assert {c["metric"].partition("@")[0] for c in cases} == {"precision", "ndcg_fixed", "dcg"}
    assert any(len(x["observed"]) < c["k"] for c in cases for x in c["lists"].values())


def test_exported_arrays_keep_obps_input_contract():
    lists = _lists(REFERENCE["cases"][0])
    a = to_obp(lists, REFERENCE["cases"][0]["metric"])
    n = len(a["action"])
    assert n == sum(len(x.observed[: REFERENCE["cases"][0]["k"]]) for x in lists.values())
    assert a["action_dist"].shape == a["estimated_rewards_by_reg_model"].shape == (n, 2, 1)
    np.testing.assert_allclose(a["action_dist"].sum(axis=1), 1.0)
    assert set(np.unique(a["action"])) <= {0, 1}
    assert ((a["pscore"] > 0) & (a["pscore"] <= 1)).all()
    assert (a["reward"][a["action"] == 1] == 0).all()


def test_unjudged_slots_and_nonlinear_metrics_are_refused():
    x = ListLabels(*(np.array(v, dtype=float) for v in ([1, 0], [1, 0], [0.5, np.nan],
                                                         [1, 0], [0.5, 0.5])))  # fmt: skip
    with pytest.raises(ValueError, match="judge-logged"):
        to_obp({"u": x}, "ndcg_fixed@2")
    with pytest.raises(ValueError, match="sums of labels"):
        to_obp({"u": x}, "mrr@2")


def test_export_writes_pickle_free_archives_named_safely(tmp_path):
    class Run:
        name = "../we ird/run"
        rankings = {"u1": ["a", "b"], "u2": ["b", "c"]}

    props = Propensities("uniform", "0.5 everywhere", {}, default=0.5)
    judged = {(u, i): (0.4, False) for u in ("u1", "u2") for i in "abc"}
    files = export_obp([Run()], {"u1": {"a": 1}}, judged, props, ["u1", "u2"],
                       ["ndcg_fixed@2", "mrr@2"], tmp_path / "obp")  # fmt: skip
    assert [f.parent for f in files] == [tmp_path / "obp"]  # the name cannot climb out
    with np.load(files[0], allow_pickle=False) as z:
        assert z["action"].tolist() == [0, 1, 1, 1]
    index = json.loads((tmp_path / "obp" / "index.json").read_text())
    assert index[0]["run"] == "../we ird/run" and index[0]["metric"] == "ndcg_fixed@2"
