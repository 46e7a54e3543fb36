"""``recjudge demo``: the main job on the embedded default model and data."""

from __future__ import annotations

import typer

from recjudge.cli._app import app


@app.command("demo")
def demo(model: str = typer.Option("smollm2-135m", help="Model preset or path.")) -> None:
    """Load the default model and print one chat reply and the model info."""
    from recjudge.llm import load_llm, preset_info

    llm = load_llm(model)
    typer.echo(f"model {model}: vocab {llm.vocab_size}, loaded in {llm.load_seconds:.1f}s")
    prompt = llm.chat_prompt([{"role": "user", "content": "Recommend one classic movie."}])
    reply = llm.generate([prompt])[0]
    typer.echo(f"reply: {reply.text}")
    typer.echo(str(preset_info(model)))
