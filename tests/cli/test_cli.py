"""The command line as a user runs it: through the CLI's entry point in this process (a
fresh interpreter would spend most of each test importing torch and transformers), and the
README's judgment once as a real subprocess of ``python -m recjudge.cli._main``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import typer

import recjudge.llm as llm
from cli_in_process import run_checked as run
from cli_in_process import run_cli
from recjudge.cli import _app
from recjudge.cli._app import _command_of
from recjudge.llm import resolve_llm_config
from recjudge.reporting import write_report
from recjudge.reward import ResultsStore

CLI = [sys.executable, "-m", "recjudge.cli._main"]


def run_process(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    """``recjudge ARGS`` in a fresh interpreter; it must succeed."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, check=True, timeout=timeout, env=env
    )


def test_models_list_json_has_three_presets():
    rows = json.loads(run("models", "list", "--json").stdout)
    assert [r["name"] for r in rows] == ["smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"]
    for r in rows:
        assert set(r) >= {"name", "params", "installed", "cached", "device", "dtype"}
    assert rows[0]["installed"] is True and rows[0]["cached"] is True  # set up by make
    # where --device auto runs on this machine (CI has no GPU: the CPU)
    import torch

    want = "cuda" if torch.cuda.is_available() else "cpu"
    assert {r["device"] for r in rows} == {want}
    assert {r["dtype"] for r in rows} <= {"bfloat16", "float32"}


#: a command as the entry point runs it, then whether it imported torch (on stdout's last line)
_IMPORTS_TORCH = (
    "import sys\n"
    "from recjudge.cli._app import main\n"
    "sys.argv = ['recjudge', *sys.argv[1:]]\n"
    "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
    "print('torch' in sys.modules)\n"
)


@pytest.mark.parametrize(
    "args", [("data", "list"), ("store", "--help"), ("judge", "--help"), ("cf", "--help")]
)
def test_a_command_that_computes_nothing_does_not_import_torch(args):
    """The root options import the LLM layer for its defaults; torch (~2 s of a ~3 s start)
    waits for a command that computes with a model."""
    out = subprocess.run(
        [sys.executable, "-c", _IMPORTS_TORCH, *args], capture_output=True, text=True, check=True
    ).stdout
    assert out.splitlines()[-1] == "False"


def test_every_public_llm_name_resolves():
    """The names ``recjudge.llm`` imports on first use are the ones it lists."""
    for name in llm.__all__:
        assert getattr(llm, name) is not None
    assert set(llm.__all__) <= set(dir(llm))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        llm.nope  # noqa: B018


def test_report_footer_names_the_gpu_or_none(tmp_path):
    import torch

    write_report(tmp_path, {"x": 1}, ["# r"])
    env = json.loads((tmp_path / "results.json").read_text())["environment"]
    assert (env["gpu"] is None) == (not torch.cuda.is_available())
    assert f"GPU: {env['gpu'] or 'none'}" in (tmp_path / "report.md").read_text()


def test_unknown_model_is_a_clear_error():
    r = run("models", "info", "smollm", check=False)
    assert r.returncode == 2 and "Did you mean 'smollm2-135m'" in r.stderr


def test_data_info_json():
    info = json.loads(run("data", "info", "ml-100k", "--json").stdout)
    assert (info["interactions"], info["users"], info["items"], info["items_rated"]) == (
        100_000,
        943,
        1_682,
        1_682,
    )
    assert set(info["event_types"]) == {
        "explicit_positive",
        "implicit_positive",
        "implicit_negative",
        "explicit_negative",
    }
    assert info["time_range"][0] < info["time_range"][1]


@pytest.mark.e2e
@pytest.mark.model  # the CLI runs SmolLM2 in the auto dtype
def test_judge_single_pair_prints_a_judgment():
    j = json.loads(
        run_process(
            "judge",
            "--data",
            "ml-1m",
            "--user",
            "1",
            "--candidate",
            "Toy Story (1995)",
            "--mode",
            "zero-shot",
            "--max-history",
            "10",
        ).stdout
    )
    assert j["user_id"] == "1" and j["mode"] == "zero-shot"
    assert j["is_relevant"] in (True, False) and 0 <= j["p_yes"] <= 1
    # In process: the same command line, without a second interpreter and torch import.
    bad = run_cli(
        "judge", "--data", "ml-1m", "--user", "1", "--candidate", "Toy Stroy",
        "--mode", "zero-shot",
    )  # fmt: skip
    assert bad.code == 2 and "Toy Story (1995)" in bad.stderr


@pytest.mark.parametrize("mode", ["brief"])
def test_brief_without_cf_explains_what_to_do(mode):
    r = run("judge", "--user", "1", "--candidate", "Toy Story (1995)", "--mode", mode, check=False)
    assert r.returncode == 2 and "--cf DIR" in r.stderr


@pytest.mark.e2e
@pytest.mark.model  # the CLI runs SmolLM2 in the auto dtype
def test_demo_main_job_runs():
    r = run("demo", "--users", "1", "--epochs", "1")
    assert "BRIEF judgments on ML-1M" in r.stdout
    assert "held-out" in r.stdout and "random" in r.stdout
    assert "YES rate: held-out" in r.stdout


def test_evaluator_and_experiment_commands_are_wired():
    top = run("--help").stdout
    for cmd in ("gist", "usersum", "arena", "bench"):
        assert cmd in top
    bench = run("bench", "--help").stdout
    for cmd in ("brief-ratings", "brief-beta", "brief-augment", "brief-offline"):
        assert cmd in bench


def test_unknown_judge_model_in_gist_run_is_a_clear_error(tmp_path):
    r = run(
        "gist",
        "run",
        "--data",
        "ml-100k",
        "--models",
        "smolm2-135m",
        "--users",
        "1",
        "--out",
        str(tmp_path),
        check=False,
    )
    assert r.returncode == 2 and "smollm2-135m" in r.stderr


def test_serve_dry_run_registers_the_processor_for_the_runner():
    out = run(
        "serve",
        "--model",
        "smollm2-135m",
        "--dry-run",
        "--runner",
        "v1",
        "--port",
        "9001",
        "--tensor-parallel-size",
        "2",
    ).stdout
    assert "VLLM_USE_V2_MODEL_RUNNER=0" in out
    assert "--logits-processors recjudge.decoding.vllm:BranchBiasV1" in out
    assert '--structured-outputs-config {"backend": "xgrammar"}' in out
    assert "--port 9001" in out and out.rstrip().endswith("--tensor-parallel-size 2")
    out2 = run("serve", "--dry-run", "--runner", "v2").stdout
    assert "VLLM_USE_V2_MODEL_RUNNER=1" in out2 and "BranchBiasV2" in out2
    bad = run("serve", "--dry-run", "--speculative-config", "{}", check=False)
    assert bad.returncode == 2 and "speculative decoding" in bad.stderr


def test_judge_against_an_unreachable_server_says_what_to_do():
    r = run(
        "judge",
        "--data",
        "ml-100k",
        "--user",
        "1",
        "--candidate",
        "1",
        "--mode",
        "no-behavior",
        "--server",
        "http://127.0.0.1:9/v1",
        check=False,
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "cannot reach http://127.0.0.1:9/v1/completions" in r.stderr
    assert "recjudge serve" in r.stderr


def test_store_export_and_import_round_trip_and_name_a_bad_file(tmp_path):
    src = tmp_path / "run" / "store.sqlite"
    row = {"user_id": "7", "candidate_id": "Heat (1995)", "mode": "zero-shot", "key": "k1",
           "is_relevant": False, "evidence": [], "p_yes": 0.2, "raw_text": ""}  # fmt: skip
    with ResultsStore(src) as s:
        s.put_many([("k1", {"user_id": "7", "candidate_text": "Heat (1995)"}, row)])
    r = run_cli("store", "export", str(src), "--out", str(tmp_path / "ck.gz"), "--json")
    assert r.code == 0, r.stderr
    assert json.loads(r.stdout)["results"] == 1
    r = run_cli("store", "import", str(tmp_path / "ck.gz"), "--into", str(tmp_path / "new.sqlite"))
    assert r.code == 0 and "judgments        1" in r.stdout
    with ResultsStore(tmp_path / "new.sqlite") as s:
        got = s.get_many(["k1"])["k1"]
    assert got["user_id"] is None and got["p_yes"] == 0.2  # ids come back from the request
    r = run_cli("store", "import", str(src), "--into", str(tmp_path / "x.sqlite"))
    assert r.code == 2 and "store.sqlite: a results store, not a checkpoint" in r.stderr
    assert "recjudge store export" in r.stderr
    assert "Traceback" not in r.stderr


def test_brief_augment_unknown_method_suggests_the_name():
    r = run_cli("bench", "brief-augment", "--methods", "none,breif", "--users", "2")
    assert r.code == 2 and "Traceback" not in r.stderr
    assert "unknown method 'breif'; did you mean 'brief'?" in r.stderr


def test_ctrl_c_exits_130_and_says_finished_work_is_kept(monkeypatch, capsys):
    """Ctrl-C inside any command: exit code 130 (the shell's convention), no traceback, and
    one line saying what survives, through the same main() the console script calls."""
    fake = typer.Typer()

    @fake.command()
    def long_run() -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(_app, "app", fake)
    monkeypatch.setattr(_app, "_register_extensions", lambda argv=None: None)
    monkeypatch.setattr(sys, "argv", ["recjudge"])
    with pytest.raises(SystemExit) as exc:
        _app.main()
    assert exc.value.code == 130
    err = capsys.readouterr().err
    assert "interrupted" in err and "finished work is kept" in err and "Traceback" not in err


def test_root_llm_options_reach_every_model_a_command_loads():
    """``recjudge --server URL <command>``: the judge command (which has no --server of its
    own in use here) loads its LLM from that server: it reports the unreachable URL as one
    line, not a traceback, and the setting does not outlive the command."""
    assert _command_of(["--backend", "vllm", "--device", "cpu", "judge", "--user", "1"]) == "judge"
    r = run_cli("--server", "http://127.0.0.1:9/v1", "judge", "--user", "1", "--candidate",
                "Toy Story (1995)", "--mode", "no-behavior", "--no-evidence")  # fmt: skip
    assert r.code != 0
    assert "127.0.0.1:9" in r.stderr and "Traceback" not in r.stderr + r.stdout
    assert resolve_llm_config("smollm2-135m").backend == "transformers"
    bad = run_cli("--vllm-args", "[1", "models", "list")
    assert bad.code == 2 and "--vllm-args" in bad.stderr


_PAUSED = (
    "import gc, json\n"
    "from recjudge._util import imports_paused\n"
    "seen = []\n"
    "with imports_paused():\n    seen.append(gc.isenabled())\n"
    "after, before = gc.isenabled(), gc.get_freeze_count()\n"
    "with imports_paused(freeze=True):\n    import recjudge.reporting\n"
    "frozen = gc.get_freeze_count()\n"
    "try:\n    with imports_paused():\n        import recjudge_no_such_module\n"
    "except ImportError:\n    pass\n"
    "print(json.dumps([seen, after, before, frozen, gc.isenabled()]))\n"
)


def test_the_start_imports_with_the_collector_paused_and_then_frozen():
    """``imports_paused`` turns the cyclic collector off for its imports and back on after
    (also when an import fails); with ``freeze`` what exists after is in the permanent
    generation, which later collections skip. A command's start leaves the collector on."""
    out = subprocess.run([sys.executable, "-c", _PAUSED], capture_output=True, text=True,
                         check=True).stdout  # fmt: skip
    seen, after, before, frozen, enabled = json.loads(out.splitlines()[-1])
    assert seen == [False] and after and enabled
    assert frozen > before
    script = _IMPORTS_TORCH.replace("print('torch' in sys.modules)",
                                    "import gc\nprint(gc.isenabled())")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", script, "data", "list"], capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    assert out.splitlines()[-1] == "True"
