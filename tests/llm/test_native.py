"""The native Llama-family forward: transformers' numbers without its modelling import."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from recjudge._util import UserFacingError
from recjudge.llm import LLMConfig, load_llm
from recjudge.llm._models import resolve_model_path
from recjudge.llm._native import (
    _BF16_PACKS,
    _REORDER,
    Linear,
    NativeCausalLM,
    RMSNorm,
    drop_packed,
    load_native,
    native_support,
    packed_weights,
)
from recjudge.llm._tokenizer import NativeTokenizer, load_transformers_tokenizer

TOL = {torch.float32: 1e-4, torch.bfloat16: 3e-2}


def _tiny(tmp_path, model_type: str, **extra):
    """A random transformers model of ``model_type`` saved as safetensors: its folder and
    the model."""
    cfg = AutoConfig.for_model(
        model_type, vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=128,
        **extra,
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    with torch.no_grad():  # norms away from 1 so a misplaced norm weight shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    folder = tmp_path / model_type
    model.save_pretrained(folder)
    return folder, model


@pytest.mark.parametrize(
    ("model_type", "extra"),
    [
        ("llama", {"tie_word_embeddings": True}),
        ("qwen2", {"tie_word_embeddings": False}),  # q/k/v biases
        ("qwen3", {"tie_word_embeddings": True}),  # per-head q/k norms
        ("mistral", {"sliding_window": None}),
    ],
)
def test_native_forward_is_transformers_forward(tmp_path, model_type, extra):
    folder, ref = _tiny(tmp_path, model_type, **extra)
    assert native_support(folder) is None
    model = load_native(folder, torch.float32)
    ids = torch.tensor([[5, 9, 17, 33, 2, 71, 8], [0, 0, 4, 60, 12, 90, 3]])
    mask = torch.tensor([[1] * 7, [0, 0, 1, 1, 1, 1, 1]])  # left padding
    with torch.inference_mode():
        got = model(input_ids=ids, attention_mask=mask).logits
        want = ref(input_ids=ids, attention_mask=mask).logits
        real = mask.bool()
        torch.testing.assert_close(got[real], want[real], atol=1e-4, rtol=1e-4)
        # a cache, then one more token at the next position
        cache_out = model(input_ids=ids[:1, :5], use_cache=True)
        step = model(input_ids=ids[:1, 5:6], past_key_values=cache_out.past_key_values)
        full = ref(input_ids=ids[:1, :6]).logits[:, -1]
        torch.testing.assert_close(step.logits[:, -1], full, atol=1e-4, rtol=1e-4)


def test_smollm_native_matches_its_transformers_twin(smollm):
    """The preset loads natively; the transformers twin (for ``generate()`` with processors)
    shares its weights and gives the same logits in the auto dtype."""
    assert isinstance(smollm.model, NativeCausalLM)
    twin = smollm.transformers_model()
    assert not isinstance(twin, NativeCausalLM)
    assert twin.lm_head.weight.data_ptr() == smollm.model.lm_head.weight.data_ptr()
    enc = smollm.tokenizer(["A movie about toys", "Hi"], return_tensors="pt", padding=True)
    with torch.inference_mode():
        got = smollm.model(**enc).logits.float()
        want = twin(**enc).logits.float()
    real = enc["attention_mask"].bool()
    tol = TOL[smollm.model.dtype]
    torch.testing.assert_close(got[real], want[real], atol=tol, rtol=tol)


def test_tokenizer_is_the_one_autotokenizer_loads():
    for preset in ("smollm2-135m",):
        folder = resolve_model_path(preset)
        mine = load_transformers_tokenizer(folder)
        auto = AutoTokenizer.from_pretrained(folder)
        assert type(mine) is type(auto)
        assert mine.all_special_ids == auto.all_special_ids
        for text in ["Toy Story (1995)", "<|im_end|> x\n\u00e9\u4e2d", "  spaces\t"]:
            assert mine(text)["input_ids"] == auto(text)["input_ids"]
        msgs = [{"role": "user", "content": "hello"}]
        assert mine.apply_chat_template(msgs, tokenize=False) == auto.apply_chat_template(
            msgs, tokenize=False
        )


def test_what_does_not_fit_loads_through_transformers(tmp_path):
    folder, _ = _tiny(tmp_path, "llama")
    cfg = json.loads((folder / "config.json").read_text())
    cases = {
        "gpt2-like": {"model_type": "gpt2"},
        "llama3 rope": {
            "rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}
        },  # fmt: skip
        "quantized": {"quantization_config": {"quant_method": "gptq"}},
    }
    for name, change in cases.items():
        (folder / "config.json").write_text(json.dumps({**cfg, **change}))
        assert native_support(folder), name
    assert native_support(tmp_path / "nowhere")
    (folder / "config.json").write_text(json.dumps(cfg))
    (folder / "model.safetensors").rename(folder / "weights.bin")
    assert "safetensors" in native_support(folder)


def test_the_tokenizer_follows_the_implementation(tmp_path, monkeypatch):
    """The native tokenizer by default; transformers' with ``implementation="transformers"``
    (a like-for-like path that is transformers' throughout)."""
    folder, _ = _tiny(tmp_path, "llama")
    smol = resolve_model_path("smollm2-135m")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (folder / name).write_bytes((smol / name).read_bytes())
    monkeypatch.setenv("RECJUDGE_CACHE", str(tmp_path / "cache"))  # its tokenizer's entry
    for impl, native in (("auto", True), ("transformers", False)):
        llm = load_llm(LLMConfig(model=str(folder), implementation=impl), reuse=False)
        assert isinstance(llm.tokenizer, NativeTokenizer) is native, impl


def test_native_insisted_on_where_it_does_not_fit_says_why(tmp_path):
    folder, _ = _tiny(tmp_path, "llama")
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "model_type": "gpt2"}))
    with pytest.raises(UserFacingError, match="gpt2.*implementation"):
        load_llm(LLMConfig(model=str(folder), implementation="native"), reuse=False)


def test_weights_that_do_not_fit_the_config_are_named(tmp_path):
    folder, _ = _tiny(tmp_path, "llama")
    state = load_file(str(folder / "model.safetensors"))
    gone = state.pop("model.layers.1.mlp.up_proj.weight")
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(ValueError, match="model.layers.1.mlp.up_proj.weight"):
        load_native(folder, torch.float32)
    state["model.layers.1.mlp.up_proj.weight"] = gone[:, :10].contiguous()
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(ValueError, match="up_proj.weight has shape"):
        load_native(folder, torch.float32)


def test_a_cold_judgment_never_imports_transformers_modelling():
    """The point of the native forward: loading a preset and decoding on the fast engine
    leave transformers' modelling stack (and torch's compiler) unimported."""
    code = (
        "import sys\n"
        "from recjudge.llm import LLMConfig, load_llm\n"
        "from recjudge.llm._config import SamplingConfig\n"
        "llm = load_llm(LLMConfig(model='smollm2-135m', dtype='float32'))\n"
        "llm.generate(['Name a film:'], sampling=SamplingConfig(max_new_tokens=3))\n"
        "print([m for m in ('transformers.modeling_utils', 'torch._dynamo',"
        " 'transformers.models.llama.modeling_llama') if m in sys.modules])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout + out.stderr


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rms_norm_is_transformers_formula(dtype):
    """The fused kernel computes ``w * x / sqrt(mean(x^2) + eps)`` in fp32, cast back before
    the weight, as transformers' ``LlamaRMSNorm`` (up to the output dtype's rounding)."""
    g = torch.Generator().manual_seed(0)
    ours, theirs = RMSNorm(96, 1e-6), LlamaRMSNorm(96, eps=1e-6)
    w = torch.randn(96, generator=g)
    ours.weight.data, theirs.weight.data = w.to(dtype), w.to(dtype)
    for scale in (1e-3, 1.0, 1e3):
        x = (torch.randn(5, 7, 96, generator=g) * scale).to(dtype)
        a, b = ours(x), theirs(x)
        assert a.dtype == b.dtype == dtype
        torch.testing.assert_close(a, b, rtol=2 ** -7 if dtype == torch.bfloat16 else 1e-6,
                                   atol=0)  # fmt: skip


@pytest.mark.skipif(not _BF16_PACKS, reason="oneDNN computes no bf16 product on this CPU")
def test_packed_weights_compute_the_same_linear_map():
    """Without autograd on the CPU in bf16 or fp32, ``Linear`` multiplies by a packed copy of
    its weight: the same map as ``F.linear`` (up to the dtype's rounding), remade when the
    weight changes in place or is replaced, and only there."""
    g = torch.Generator().manual_seed(0)
    lin = Linear(64, 96, bias=True)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(96, 64, generator=g) * 0.1)
        lin.bias.copy_(torch.randn(96, generator=g))
    lin = lin.to(torch.bfloat16)
    x = torch.randn(2, 5, 64, generator=g).to(torch.bfloat16)
    tol = {"rtol": 2**-7, "atol": 1e-2}

    def check() -> None:
        with torch.inference_mode():
            got = lin(x)
        assert "_packed_weight" in lin.__dict__
        want = torch.nn.functional.linear(x.float(), lin.weight.float(), lin.bias.float())
        torch.testing.assert_close(got.float(), want, **tol)

    check()
    with torch.no_grad():
        lin.weight.mul_(-2)  # in place: the version counter moves, the copy is remade
    check()
    lin.weight = torch.nn.Parameter(lin.weight.detach().flip(0))  # replaced
    check()
    lin.weight.data.mul_(3)  # through .data, which no counter sees: drop_packed says so
    drop_packed(lin)
    assert "_packed_weight" not in lin.__dict__
    check()
    # with autograd, or switched off, it is F.linear on the weight itself
    drop_packed(lin)
    xg = x.clone().requires_grad_()
    lin(xg).float().sum().backward()
    assert xg.grad is not None and "_packed_weight" not in lin.__dict__
    with torch.inference_mode(), packed_weights(False):
        lin(x)
    assert "_packed_weight" not in lin.__dict__
    # fp32 packs too (the same map up to fp32 rounding); fp16 does not
    lin32 = Linear(64, 96, bias=False)
    with torch.no_grad():
        lin32.weight.copy_(torch.randn(96, 64, generator=g))
    x32 = torch.randn(3, 64, generator=g)
    with torch.inference_mode():
        got = lin32(x32)
    assert "_packed_weight" in lin32.__dict__
    torch.testing.assert_close(got, x32 @ lin32.weight.detach().T, rtol=1e-5, atol=1e-5)
    lin16 = Linear(64, 96, bias=False).to(torch.float16)
    with torch.inference_mode():
        lin16(torch.ones(3, 64, dtype=torch.float16))
    assert "_packed_weight" not in lin16.__dict__


@pytest.mark.skipif(_REORDER is None, reason="torch built without oneDNN")
def test_bf16_stays_unpacked_where_onednn_has_no_bf16_product():
    """On a CPU without AVX512-BW/VL/DQ (an AVX2-only one: oneDNN held to AVX2 here), oneDNN's
    bf16 reorder raises; there bf16 ``Linear`` is ``F.linear`` and fp32 still packs."""
    code = """
import torch
from recjudge.llm._native import _BF16_PACKS, Linear
assert not _BF16_PACKS
g = torch.Generator().manual_seed(0)
for dtype in (torch.bfloat16, torch.float32):
    lin = Linear(64, 96, bias=True).to(dtype)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(96, 64, generator=g))
        lin.bias.copy_(torch.randn(96, generator=g))
    x = torch.randn(3, 64, generator=g).to(dtype)
    with torch.inference_mode():
        got = lin(x)
    want = torch.nn.functional.linear(x, lin.weight, lin.bias)
    torch.testing.assert_close(got.float(), want.float(), rtol=2**-7, atol=1e-2)
    print(dtype, "_packed_weight" in lin.__dict__)
"""
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, env=env)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["torch.bfloat16 False", "torch.float32 True"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_native_forward_with_and_without_packed_weights(tmp_path, dtype):
    """A whole forward (decoder, head, a cached step) gives the same logits with the packed
    weights as without them, up to the dtype's rounding."""
    folder, _ = _tiny(tmp_path, "qwen2", tie_word_embeddings=False)
    model = load_native(folder, dtype)
    ids = torch.tensor([[5, 9, 17, 33, 2, 71, 8]])
    out = {}
    for packed in (False, True):
        with torch.inference_mode(), packed_weights(packed):
            cache_out = model(input_ids=ids[:, :5], use_cache=True)
            step = model(input_ids=ids[:, 5:6], past_key_values=cache_out.past_key_values)
            out[packed] = (cache_out.logits.float(), step.logits.float())
    tol = TOL[dtype]
    for a, b in zip(out[False], out[True], strict=True):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)
