"""The ``recjudge`` command line (typer). It parses arguments and calls library functions."""

from recjudge.cli._app import app, main

__all__ = ["app", "main"]
