"""Exports for outside libraries (issue 112): RecBole's atomic files read back by RecBole's
own rules (tab-separated ``field:type`` header, nothing quoted), whatever the ids hold; the
plain tables hold the columns LensKit and Cornac take."""

from __future__ import annotations

import pandas as pd
import pytest

from cli_in_process import run_cli
from recjudge.data import DataError, Dataset, export_recbole, export_tables, split_past_future


def _read_atomic(path):
    """A RecBole atomic file as RecBole's loader reads it: the header's ``name:type`` fields,
    then each line split at tabs (every other character is data)."""
    lines = path.read_text(encoding="utf-8").split("\n")
    assert lines[-1] == ""  # one record per line, the last one terminated
    header = [f.split(":") for f in lines[0].split("\t")]
    assert all(len(f) == 2 and f[1] in ("token", "token_seq", "float", "float_seq")
               for f in header)  # fmt: skip
    rows = [line.split("\t") for line in lines[1:-1]]
    assert all(len(r) == len(header) for r in rows)
    return pd.DataFrame(rows, columns=[f"{n}:{t}" for n, t in header])


def test_a_split_exports_to_recbole_and_reads_back(ml100k, tmp_path):
    past, _ = split_past_future(ml100k, fraction=0.2)
    paths = export_recbole(past, tmp_path / "past")
    assert [p.name for p in paths] == ["past.inter", "past.item", "past.user"]
    inter = _read_atomic(tmp_path / "past/past.inter")
    assert list(inter.columns)[:2] == ["user_id:token", "item_id:token"]
    assert inter["user_id:token"].tolist() == past.interactions["user_id"].astype(str).tolist()
    assert inter["item_id:token"].tolist() == past.interactions["item_id"].astype(str).tolist()
    assert inter["rating:float"].astype(float).tolist() == past.interactions["rating"].tolist()
    item = _read_atomic(tmp_path / "past/past.item")
    toy = item[item["item_id:token"] == "1"].iloc[0]
    assert toy["genres:token_seq"].split(" ") == ["Animation", "Children's", "Comedy"]


def _hostile(user: str, item: str, title: str) -> Dataset:
    inter = pd.DataFrame({"user_id": [user, "u2"], "item_id": [item, item], "timestamp": [1, 2],
                          "rating": [5.0, 1.0],
                          "event_type": ["explicit_positive", "explicit_negative"]})  # fmt: skip
    items = pd.DataFrame({"item_id": [item], "title": [title], "genres": ["Film Noir|Drama"]})
    return Dataset("h", inter, items)


def test_recbole_keeps_any_id_it_can_carry_and_names_one_it_cannot(tmp_path):
    item = 'it"em, with ; "quotes"'
    export_recbole(_hostile("ü ser", item, 'A "title"\twith a tab'), tmp_path / "h")
    inter = _read_atomic(tmp_path / "h/h.inter")
    assert inter["user_id:token"].tolist() == ["ü ser", "u2"]
    assert set(inter["item_id:token"]) == {item}
    items = _read_atomic(tmp_path / "h/h.item")
    assert items["title:token_seq"].tolist() == ['A "title" with a tab']  # free text: folded
    assert items["genres:token_seq"].tolist() == ["Film_Noir Drama"]
    with pytest.raises(DataError) as e:
        export_recbole(_hostile("u\t1", item, "t"), tmp_path / "bad")
    assert "row 1" in str(e.value) and "user_id" in str(e.value) and "tab" in str(e.value)


def test_the_tables_hold_the_columns_lenskit_and_cornac_take(ml100k, tmp_path):
    export_tables(ml100k, tmp_path, "csv")
    inter = pd.read_csv(tmp_path / "interactions.csv", dtype={"user_id": str, "item_id": str})
    # LensKit's from_interactions_df and Cornac's Dataset.from_uir (docs/models.md)
    assert {"user_id", "item_id", "rating", "timestamp"} <= set(inter.columns)
    triples = list(inter[["user_id", "item_id", "rating"]].itertuples(index=False))
    assert len(triples) == len(ml100k.interactions) and isinstance(triples[0][0], str)


def test_data_export_recbole_from_the_command_line(tmp_path):
    r = run_cli("data", "export", "ml-100k", "--format", "recbole", "--out",
                str(tmp_path / "ml100k"))  # fmt: skip
    assert r.code == 0, r.stderr
    assert (tmp_path / "ml100k/ml100k.inter").is_file() and "ml100k.item" in r.stdout
    bad = run_cli("data", "export", "ml-100k", "--format", "recbol", "--out", str(tmp_path))
    assert bad.code == 2 and "recbole" in bad.stderr
