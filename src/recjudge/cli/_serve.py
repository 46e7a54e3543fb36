"""``recjudge serve``: a vLLM OpenAI-compatible server with recjudge's bias processor."""

from __future__ import annotations

import os

import typer

from recjudge._util import is_loopback
from recjudge.cli._app import app, fail


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
    host: str = typer.Option(
        "127.0.0.1", "--host", help="Address to listen on (non-loopback needs an API key)."
    ),
    port: int = typer.Option(8000, "--port", help="Port to listen on."),
    dtype: str = typer.Option("bfloat16", "--dtype", help="vLLM's --dtype."),
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
    from recjudge.llm import serve_command

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
