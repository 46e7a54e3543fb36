"""Device plumbing, checked on the CPU: every tensor recjudge's engines create names a device
(the model's), so on a GPU nothing is silently made on the CPU; and the device settings."""

from __future__ import annotations

import sys
from functools import cache
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode

import recjudge
from cli_in_process import run_cli
from recjudge.decoding import BranchBias, EvidenceFirst, constrained_generate
from recjudge.llm import DeviceError, LLMConfig, OptionTrie, SamplingConfig, best_options, load_llm
from recjudge.reward import HistoryItem, Judge, JudgeConfig, JudgeRequest, request_for

#: recjudge's own source folder, from the package's location (not a substring of the path:
#: a clone in a folder named ``recjudge`` holds ``.venv/.../xgrammar`` under ``/recjudge/``)
OURS = str(Path(recjudge.__file__).resolve().parent) + "/"


@cache
def _resolved(filename: str) -> str:
    return str(Path(filename).resolve())


FACTORIES = {"zeros", "ones", "full", "empty", "arange", "tensor", "as_tensor", "rand", "randn",
             "randint", "eye", "linspace"}  # fmt: skip


class _NoHostFactories(TorchFunctionMode):
    """Records every tensor factory that recjudge's own code calls without ``device=``."""

    def __init__(self) -> None:
        super().__init__()
        self.bare: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in FACTORIES and "device" not in kwargs:
            caller = sys._getframe(1)
            where = _resolved(caller.f_code.co_filename)
            if where.startswith(OURS):
                self.bare.append(f"torch.{name} at {where[len(OURS) :]}:{caller.f_lineno}")
        return func(*args, **kwargs)


@pytest.fixture(scope="module")
def requests(ml1m):
    reqs = [request_for(ml1m, "1", c) for c in ("Toy Story (1995)", "Heat (1995)")]
    for r, s in zip(reqs, (0.6, -0.4), strict=True):
        r.sigma = s
    return reqs


@pytest.mark.parametrize(
    "settings",
    [
        {},  # the fast engine, grammar + bias, head over the allowed tokens
        {"deterministic": True},  # the batch-invariant engine
        {"need_evidence": False},  # read-out: stops at the decision
        {"samples": 2, "mode": "no-behavior"},  # sampled: per-row generators
    ],
)
def test_the_engines_create_every_tensor_on_the_models_device(smollm32, requests, settings):
    extra = (
        {"sampling": SamplingConfig.paper(seed=3, max_new_tokens=64)}
        if "samples" in settings
        else {}
    )
    cfg = JudgeConfig(max_history=10, max_evidence=2, **settings, **extra)
    judge = Judge(cfg, llm=smollm32)
    with _NoHostFactories() as mode:
        out = judge.judge_many(requests)
    assert len(out) == 2 and all(j.error is None for j in out)
    assert mode.bare == [], mode.bare


def test_naive_generate_and_the_option_choice_name_the_device(smollm32):
    prompt = smollm32.chat_prompt([{"role": "user", "content": "Would I like Heat (1995)?"}])
    with _NoHostFactories() as mode:
        constrained_generate(smollm32, [prompt], EvidenceFirst(["Fargo (1996)"], 1),
                             signal=[0.5], bias=BranchBias(beta=2.0))  # fmt: skip
        ids = smollm32.encode(prompt)
        trie = OptionTrie([smollm32.encode(" Crime"), smollm32.encode(" Comedy")])
        best_options(smollm32, ids[:-2], [ids[-2:]], trie)
    assert mode.bare == [], mode.bare


def test_device_settings():
    assert LLMConfig().resolved_device() in ("cpu", "cuda")
    assert LLMConfig(device="cpu").resolved_device() == "cpu"
    assert LLMConfig(device="cuda:1").device == "cuda:1"
    with pytest.raises(ValueError, match="use auto, cpu, cuda or cuda:N"):
        LLMConfig(device="gpu")
    if not torch.cuda.is_available():
        with pytest.raises(DeviceError, match="torch sees no CUDA GPU"):
            load_llm(LLMConfig(model="smollm2-135m", device="cuda"))


def test_a_gpu_judgment_is_keyed_apart_and_computes_in_bf16(monkeypatch):
    """Without a GPU at hand: what auto resolves to on one (bf16), and that its results get
    their own keys, while the CPU keys stay as they were."""
    monkeypatch.delenv("RECJUDGE_DTYPE", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert LLMConfig(device="auto").resolved_dtype() == "bfloat16"
    assert LLMConfig(device="cpu").resolved_dtype() in ("bfloat16", "float32")  # this CPU's
    req = JudgeRequest("7", [HistoryItem("i1", "Up", "Up", None)], "i9", "Heat", sigma=0.1)
    j = Judge(JudgeConfig(), llm=object())
    assert j._llm_settings()["device"] == "cuda"
    gpu_key = j.key(req)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "device" not in j._llm_settings() and j.key(req) != gpu_key


def test_the_device_option_of_the_commands():
    r = run_cli("judge", "--data", "ml-100k", "--user", "1", "--candidate", "1",
                "--mode", "zero-shot", "--device", "gpu")  # fmt: skip
    assert r.code == 2 and "--device: device 'gpu': use auto, cpu, cuda or cuda:N" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    if not torch.cuda.is_available():
        r = run_cli("judge", "--data", "ml-100k", "--user", "1", "--candidate", "1",
                    "--mode", "zero-shot", "--device", "cuda")  # fmt: skip
        assert r.code == 2 and "torch sees no CUDA GPU here" in r.stderr
        assert "Traceback" not in r.stderr
