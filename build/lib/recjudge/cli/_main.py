"""``python -m recjudge.cli._main``: the CLI entry point as a module (used by tests)."""

from recjudge.cli._app import main

if __name__ == "__main__":
    main()
