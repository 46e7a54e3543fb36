"""The layering of ``../shared/ARCHITECTURE.md``, read from the code: a package imports only
the packages below it (function-local imports included), so ``reward`` never imports
``distributed`` (its executors are chosen where a job is built) and ``llm`` knows nothing of
grammars or judging."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "src" / "recjudge"

_BELOW_REWARD = {"decoding", "llm", "cf_models", "data"}
#: package -> the recjudge packages it may import (besides the shared private modules)
ALLOWED: dict[str, set[str]] = {
    "data": set(),
    "llm": set(),
    "reporting": {"data"},
    "cf_models": {"data"},
    "decoding": {"llm"},
    "reward": _BELOW_REWARD,
    "distributed": _BELOW_REWARD | {"reward"},
    "tune": _BELOW_REWARD | {"reward"},
    "evaluators": _BELOW_REWARD | {"reward", "distributed", "reporting", "tune"},
    "bench": _BELOW_REWARD | {"reward", "distributed", "reporting", "evaluators", "tune"},
    "cli": _BELOW_REWARD | {"reward", "distributed", "reporting", "evaluators", "bench", "tune"},
}


def _imported(path: Path) -> set[str]:
    """The recjudge packages and modules ``path`` imports (first name after ``recjudge.``)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        out |= {n.split(".")[1] for n in names if n.startswith("recjudge.")}
    return out


def test_every_package_imports_only_the_layers_below_it():
    # _util, _registry, _stats, ... (``__main__`` is the command line's entry point)
    shared = {p.stem for p in ROOT.glob("_*.py")} - {"__main__", "__init__"}
    assert set(ALLOWED) == {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()}
    wrong = []
    for pkg, allowed in ALLOWED.items():
        for f in sorted((ROOT / pkg).rglob("*.py")):
            bad = _imported(f) - allowed - shared - {pkg}
            wrong += [f"{f.relative_to(ROOT)} imports recjudge.{b}" for b in sorted(bad)]
    for f in ROOT.glob("_*.py"):  # the shared modules sit below every package
        if f.stem in ("__main__", "__init__"):
            continue
        bad = _imported(f) - shared
        wrong += [f"{f.relative_to(ROOT)} imports recjudge.{b}" for b in sorted(bad)]
    assert not wrong, "\n".join(wrong)


def test_a_package_reaches_another_only_through_its_public_names():
    """Issue 114: ``from recjudge.reward._judge import Judge`` in another package couples it
    to a private module that may move; ``from recjudge.reward import Judge`` does not. The
    shared modules (``recjudge._util``, ...) are below every package and exempt."""
    wrong = []
    for f in sorted(ROOT.rglob("*.py")):
        rel = f.relative_to(ROOT)
        own = rel.parts[0] if len(rel.parts) > 1 else None
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.ImportFrom) and node.module and node.level == 0):
                continue
            parts = node.module.split(".")
            if parts[0] != "recjudge" or len(parts) < 2 or parts[1].startswith("_"):
                continue
            if parts[1] == own:
                continue
            private = [p for p in parts[2:] if p.startswith("_")]
            names = [a.name for a in node.names if a.name.startswith("_")]
            if private or names:
                wrong.append(f"{rel}:{node.lineno} from {node.module} import "
                             f"{', '.join(a.name for a in node.names)}")  # fmt: skip
    assert not wrong, "\n".join(wrong)


#: the longest class a reader takes in (issue 114)
MAX_CLASS_LINES = 300
#: the longest function body a reader takes in at once (issue 90: none over 80 lines)
MAX_FUNCTION_LINES = 80


def _longer_than(kinds: type | tuple[type, ...], limit: int) -> list[str]:
    """``file:line name: N lines`` for every node of ``kinds`` in the package over ``limit``."""
    long = []
    for f in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, kinds):
                n = node.end_lineno - node.lineno + 1  # type: ignore[attr-defined]
                if n > limit:
                    long.append(f"{f.relative_to(ROOT)}:{node.lineno} {node.name}: {n} lines")
    return long


def test_no_class_is_longer_than_three_hundred_lines():
    long = _longer_than(ast.ClassDef, MAX_CLASS_LINES)
    assert not long, "\n".join(long)


def test_no_function_is_longer_than_a_screen():
    long = _longer_than((ast.FunctionDef, ast.AsyncFunctionDef), MAX_FUNCTION_LINES)
    assert not long, "\n".join(long)


def test_the_scripts_import_what_exists():
    """``scripts/`` runs outside the suite (set-up runs ``warm_jit.py``, the cross-checks run
    against obp, ppi_py and glide-py), so a module moved in ``src`` breaks them silently; every
    ``from recjudge.X import Y`` there must name a module and names that exist."""
    missing = []
    for path in sorted((ROOT.parents[1] / "scripts").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                    and node.module.split(".")[0] == "recjudge"):  # fmt: skip
                continue
            try:
                module = importlib.import_module(node.module)
            except ModuleNotFoundError as err:
                missing.append(f"{path.name}:{node.lineno}: {err}")
                continue
            missing += [f"{path.name}:{node.lineno}: {node.module} has no {a.name}"
                        for a in node.names if not hasattr(module, a.name)]  # fmt: skip
    assert not missing, "\n".join(missing)
