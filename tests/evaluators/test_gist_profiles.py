"""Profiles at a team's pace (issue 112): example profiles written from the installed data,
``gist verify --users``, and the judge answers every later run and system reuses."""

from __future__ import annotations

import json

import pytest

from cli_in_process import run_cli
from recjudge._util import UserFacingError
from recjudge.data import DataError
from recjudge.evaluators import (
    EXAMPLE_SYSTEMS,
    GistConfig,
    example_profiles,
    verify_profiles,
    write_example_profiles,
)
from recjudge.evaluators.gist._pipeline import read_profiles


def test_example_profiles_cite_the_users_history_and_read_back(ml100k, tmp_path):
    profiles = example_profiles(ml100k, users=4, interests=3, cite=5)
    assert set(profiles) == set(EXAMPLE_SYSTEMS)
    users = [p["user_id"] for p in profiles["genres"]]
    assert len(users) == 4 and users == [p["user_id"] for p in profiles["popular"]]
    genres = dict(zip(ml100k.items["item_id"].astype(str), ml100k.items["genres"], strict=True))
    for ps in profiles.values():
        for p in ps:
            history = set(ml100k.history(p["user_id"])["item_id"].astype(str))
            assert 0 < len(p["interests"]) <= 3
            for it in p["interests"]:
                genre = it["name"].removesuffix(" movies")
                assert 0 < len(it["object_ids"]) <= 5 and set(it["object_ids"]) <= history
                assert all(genre in genres[i].split("|") for i in it["object_ids"])
    # the popular system names the same genres for everyone; the genres system need not
    assert len({tuple(i["name"] for i in p["interests"]) for p in profiles["popular"]}) >= 1
    paths = write_example_profiles(ml100k, tmp_path, users=4)
    for system, path in paths.items():
        interests, check = read_profiles(path, ml100k)
        assert check.profiles == 4 and not check.problems()
        assert {i.model for i in interests} == {system}
    with pytest.raises(DataError, match="already there.*--force"):
        write_example_profiles(ml100k, tmp_path, users=4)
    write_example_profiles(ml100k, tmp_path, users=2, force=True)
    assert len(paths["genres"].read_text().splitlines()) == 2
    assert len((tmp_path / "genres.jsonl.bak-1").read_text().splitlines()) == 4  # kept


def test_example_profiles_need_genres(ml100k):
    no_genres = type("D", (), {"items": ml100k.items.drop(columns="genres"), "name": "x"})()
    with pytest.raises(DataError, match="no item genres"):
        example_profiles(no_genres)


def _config():
    return GistConfig(judge="smollm2-135m", options=4, pool_size=40, taxonomy="off",
                      bootstrap=0)  # fmt: skip


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.model
def test_users_samples_common_users_and_shared_answers_serve_later_runs(smollm, ml100k, tmp_path):
    profiles = example_profiles(ml100k, users=3, interests=1, cite=2)
    a = _write(tmp_path / "a.jsonl", profiles["genres"])
    b = _write(tmp_path / "b.jsonl", profiles["popular"][:2])  # user 3 only in a
    answers, llms = tmp_path / "answers.sqlite", {"smollm2-135m": smollm}
    first = verify_profiles(_config(), "ml-100k", [a, b], tmp_path / "one", llms=llms,
                            progress=False, users=1, answers=answers)  # fmt: skip
    both = {p["user_id"] for p in profiles["popular"][:2]}
    assert first["user_sample"]["users"] == 1 and first["user_sample"]["in_every_file"] == 2
    assert set(first["users"]) <= both and len(first["users"]) == 1
    assert "Users: 1 sampled in sha256 order" in (tmp_path / "one/report.md").read_text()
    assert first["cost"]["judge"]["asked_now"] > 0
    # a later run into another folder, with a larger sample: the first user's answers are
    # not asked again, and the sample extends the first one
    later = verify_profiles(_config(), "ml-100k", [a, b], tmp_path / "two", llms=llms,
                            progress=False, users=2, answers=answers)  # fmt: skip
    assert set(first["users"]) < set(later["users"]) == both
    one = {r["user_id"]: r for r in map(json.loads, (tmp_path / "one/interests.jsonl").open())}
    for r in map(json.loads, (tmp_path / "two/interests.jsonl").open()):
        if r["user_id"] in one and r["model"] == one[r["user_id"]]["model"]:
            assert r["surviving"] == one[r["user_id"]]["surviving"]
    again = verify_profiles(_config(), "ml-100k", [a, b], tmp_path / "three", llms=llms,
                            progress=False, users=2, answers=answers)  # fmt: skip
    assert again["cost"]["judge"]["asked_now"] == 0
    assert again["scores"] == later["scores"]
    alone = _config().model_copy(update={"share_judge_answers": False})
    unshared = verify_profiles(alone, "ml-100k", [a, b], tmp_path / "four", llms=llms,
                               progress=False, users=2, answers=answers)  # fmt: skip
    assert unshared["cost"]["judge"]["asked_now"] > 0  # nothing shared: asked again


def test_users_needs_a_user_in_every_file(ml100k, tmp_path):
    profiles = example_profiles(ml100k, users=2, interests=1, cite=1)
    a = _write(tmp_path / "a.jsonl", profiles["genres"][:1])
    b = _write(tmp_path / "b.jsonl", profiles["popular"][1:])
    with pytest.raises(UserFacingError, match="no user has"):
        verify_profiles(_config(), "ml-100k", [a, b], tmp_path / "o", progress=False, users=1)


def test_example_profiles_command(tmp_path):
    out = tmp_path / "profiles"
    r = run_cli("gist", "example-profiles", "--data", "ml-100k", "--users", "2", "--out", str(out))
    assert r.code == 0, r.stderr
    assert "gist verify --data ml-100k --profiles" in r.stdout
    assert len((out / "genres.jsonl").read_text().splitlines()) == 2
    again = run_cli("gist", "example-profiles", "--users", "2", "--out", str(out))
    assert again.code == 2 and "already there" in again.stderr and "--force" in again.stderr
    bad = run_cli("gist", "verify", "--data", "ml-100k", "--profiles", str(out / "genres.jsonl"),
                  "--users", "0", "--out", str(tmp_path / "v"))  # fmt: skip
    assert bad.code == 2 and "--users" in bad.stderr


@pytest.mark.model
def test_a_shared_store_that_cannot_open_only_costs_speed(smollm, ml100k, tmp_path, caplog):
    profiles = example_profiles(ml100k, users=1, interests=1, cite=1)
    a = _write(tmp_path / "a.jsonl", profiles["genres"])
    (tmp_path / "answers").mkdir()  # a folder where the store file should be
    r = verify_profiles(_config(), "ml-100k", [a], tmp_path / "o", progress=False,
                        llms={"smollm2-135m": smollm}, answers=tmp_path / "answers")  # fmt: skip
    assert r["scores"] and r["cost"]["judge"]["asked_now"] > 0
    assert "shared GISTBench judge answers are not used" in caplog.text
