"""`recjudge data import`: your files in, a dataset folder out, identical on a round trip;
every hint names a flag that exists."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest

from cli_in_process import run_cli as run
from recjudge.data import load_dataset


def test_ml100k_csv_round_trip_is_identical(ml100k, tmp_path):
    inter = ml100k.interactions.rename(
        columns={"user_id": "uid", "item_id": "iid", "rating": "stars", "timestamp": "ts",
                 "event_type": "action"}
    )  # fmt: skip
    inter.to_csv(tmp_path / "log.csv", index=False)
    ml100k.items.to_csv(tmp_path / "items.tsv", sep="\t", index=False)
    out = tmp_path / "mine"
    r = run("data", "import", str(tmp_path / "log.csv"), "--items", str(tmp_path / "items.tsv"),
            "--mapping", "user_id=uid,item_id=iid,rating=stars,timestamp=ts,event_type=action",
            "--domain", "movies", "--out", str(out), "--json")  # fmt: skip
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert (info["interactions"], info["users"], info["items"]) == (100_000, 943, 1_682)

    back = load_dataset(str(out))  # what every --data option accepts
    cols = ["user_id", "item_id", "timestamp", "rating", "event_type"]
    a = back.interactions[cols].astype(str).reset_index(drop=True)
    b = ml100k.interactions[cols].astype(str).reset_index(drop=True)
    pd.testing.assert_frame_equal(a, b)
    assert back.items["title"].tolist() == ml100k.items["title"].astype(str).tolist()


def test_orphans_are_refused_then_dropped_and_counted(tmp_path):
    (tmp_path / "log.csv").write_text("user_id,item_id\nu1,a\nu1,zzz\nu2,a\n")
    (tmp_path / "items.csv").write_text("item_id,title\na,Heat (1995)\n")
    base = ["data", "import", str(tmp_path / "log.csv"), "--items", str(tmp_path / "items.csv"),
            "--out", str(tmp_path / "ds")]  # fmt: skip
    r = run(*base)
    assert r.returncode == 2 and "row 2" in r.stderr and "--drop-orphans" in r.stderr
    r = run(*base, "--drop-orphans", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["removed"] == {"orphans": 1}


@pytest.mark.parametrize(
    ("content", "extra"),
    [("uid,iid\nu1,a\n", []),  # columns not mapped
     ("user_id,item_id,timestamp\nu1,a,1\nu1,a,1\n", []),  # duplicates
     ("user_id,item_id\nu1,caf\xe9\n", []),  # not UTF-8
     ("user_id,item_id\nu1,a\n", ["--mapping", "user_id"])],  # a malformed mapping
)  # fmt: skip
def test_every_hint_names_a_flag_that_exists(tmp_path, content, extra):
    f = tmp_path / "log.csv"
    f.write_bytes(content.encode("latin-1"))
    r = run("data", "import", str(f), "--out", str(tmp_path / "ds"), *extra)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    hinted = set(re.findall(r"--[a-z][a-z-]+", r.stderr))
    assert hinted, r.stderr
    help_text = run("data", "import", "--help").stdout
    assert all(flag in help_text for flag in hinted), (hinted, r.stderr)
