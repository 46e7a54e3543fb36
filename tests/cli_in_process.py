"""Run ``recjudge ARGS`` through ``cli.main`` in the test process (no interpreter start-up,
no second torch import): exit code, stdout and stderr."""

from __future__ import annotations

import io
import os
import sys
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

from recjudge.cli._app import main


@dataclass
class CliResult:
    code: int
    stdout: str
    stderr: str

    @property
    def returncode(self) -> int:
        """``code`` under ``subprocess.CompletedProcess``'s name."""
        return self.code


def run_checked(*args: str, check: bool = True, **kw) -> CliResult:
    """``run_cli``; with ``check``, a non-zero exit fails the test with the command's stderr."""
    r = run_cli(*args, **kw)
    if check and r.code != 0:
        raise AssertionError(f"recjudge {' '.join(args)} exited {r.code}:\n{r.stderr[-3000:]}")
    return r


def run_cli(*args: str, cwd: str | os.PathLike | None = None, env: dict | None = None) -> CliResult:
    """The command's exit code and output; argv, the working folder and the environment are
    restored afterwards."""
    out, err = io.StringIO(), io.StringIO()
    old_argv, old_cwd, old_env = sys.argv, os.getcwd(), dict(os.environ)
    sys.argv = ["recjudge", *args]
    os.environ.update(env or {})
    if cwd is not None:
        os.chdir(cwd)
    try:
        with redirect_stdout(out), redirect_stderr(err):
            main()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    finally:
        sys.argv = old_argv
        os.chdir(old_cwd)
        os.environ.clear()
        os.environ.update(old_env)
    return CliResult(code, out.getvalue(), err.getvalue())


def write_files(folder, files) -> None:
    """Write ``{relative name: text or bytes}`` under ``folder`` (parents created)."""
    for name, content in files.items():
        p = Path(folder) / name
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            p.write_bytes(content)
        else:
            p.write_text(content, encoding="utf-8")
