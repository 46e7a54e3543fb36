"""The device check runs anywhere (CI: the CPU, a tiny configuration of the architecture)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from recjudge.bench._gpu_check import QWEN25_15B, gpu_check, random_backend, synthetic_requests
from recjudge.llm import PRESETS

TINY = dict(QWEN25_15B, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, initializer_range=0.5)  # fmt: skip


def test_synthetic_requests_mix_verdicts_without_a_dataset():
    groups = synthetic_requests(users=3, candidates=10, history=50)
    assert [len(g) for g in groups] == [10, 10, 10]
    for g in groups:
        past = {h.item_id for h in g[0].history}
        assert len(past) == 50 and all(r.history == g[0].history for r in g)
        assert not past & {r.candidate_id for r in g}  # a candidate is never in the past
    sigmas = [r.sigma for g in groups for r in g]
    assert all(-1 <= s <= 1 for s in sigmas) and min(sigmas) < 0 < max(sigmas)
    assert synthetic_requests(2, 3, 5, seed=1)[1][2].candidate_id == (
        synthetic_requests(2, 3, 5, seed=1)[1][2].candidate_id
    )


def test_random_backend_builds_the_architecture_on_the_asked_device():
    tok = PRESETS.get("smollm2-135m").cache_path()
    llm = random_backend(tok, device="cpu", dtype="float32", arch=TINY)
    assert str(llm.model.device) == "cpu" and llm.dtype == "float32"
    assert llm.model.config.num_hidden_layers == 2
    assert llm.capabilities.device == "cpu"
    assert llm.vocab_size >= len(llm.tokenizer)


def test_gpu_check_on_the_cpu_reports_parity_and_rates(tmp_path):
    tok = PRESETS.get("smollm2-135m").cache_path()
    r = gpu_check(tok, device="cpu", dtype="float32", users=2, candidates=3, history=5,
                  parity_requests=3, arch=TINY, out=tmp_path)  # fmt: skip
    assert r["device"] == "cpu" and r["gpu"] is None and r["dtype"] == "float32"
    p = r["parity"]
    # fp32: the engine decides every verdict as generate() does
    assert p["requests"] == 3 and p["verdicts_equal"] == 3
    assert set(r["methods"]) == {"naive_full", "batched_generate_full", "engine_full",
                                 "engine_readout", "engine_full_together",
                                 "engine_readout_together"}  # fmt: skip
    assert r["methods"]["naive_full"]["judgments"] == 3  # naive on one user only
    # every user in one call: the same judgments as user by user, the same verdicts (fp32)
    together = r["methods"]["engine_full_together"]
    assert together["judgments"] == r["methods"]["engine_full"]["judgments"]
    assert together["yes_rate"] == r["methods"]["engine_full"]["yes_rate"]
    for m in r["methods"].values():
        assert m["judgments_per_s"] > 0 and 0 <= m["yes_rate"] <= 1
    assert r["methods"]["engine_full"]["judgments"] == 6
    # the engine's rows count its forwards and drafts (at least one forward per judgment
    # batch; drafts taken never exceed drafts fed)
    for name in ("engine_full", "engine_readout", "engine_full_together"):
        m = r["methods"][name]
        assert m["decode_steps"] >= 1 and m["decode_tokens"] >= m["decode_steps"]
        assert 0 <= m["draft_accepted"] <= m["draft_tokens"] < m["decode_tokens"]
    assert "decode_steps" not in r["methods"]["naive_full"]
    assert r["ratios"]["engine_full_vs_naive"] == pytest.approx(
        r["methods"]["engine_full"]["judgments_per_s"]
        / r["methods"]["naive_full"]["judgments_per_s"], abs=0.01,
    )  # fmt: skip
    assert json.loads((tmp_path / "gpu_check.json").read_text())["parity"] == p


def test_cli_names_a_missing_gpu_in_one_line():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    r = subprocess.run(
        [sys.executable, "-m", "recjudge", "bench", "gpu-check", "--device", "cuda"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "torch sees no CUDA GPU" in r.stderr
