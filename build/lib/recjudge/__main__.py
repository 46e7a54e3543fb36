"""``python -m recjudge``."""

from recjudge.cli import main

main()
