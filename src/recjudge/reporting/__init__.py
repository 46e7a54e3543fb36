"""Report writers shared by evaluators and benchmarks (imports nothing above ``data``)."""

from recjudge.reporting._figure import figure
from recjudge.reporting._format import interval
from recjudge.reporting._write import environment, write_report

__all__ = ["environment", "figure", "interval", "write_report"]
