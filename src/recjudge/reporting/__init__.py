"""Report writers shared by evaluators and benchmarks (imports nothing above ``data``)."""

from recjudge.reporting._figure import figure
from recjudge.reporting._format import interval
from recjudge.reporting._html import interval_svg, markdown_to_html, render_html, write_html
from recjudge.reporting._mlflow import (
    ENV_URI,
    TrackingError,
    check_tracking,
    log_report,
    tracking_uri,
)
from recjudge.reporting._tables import (
    PaperTable,
    latex_escape,
    paper_table,
    read_results,
    to_csv,
    to_latex,
)
from recjudge.reporting._write import environment, write_report

__all__ = [
    "check_tracking",
    "ENV_URI",
    "TrackingError",
    "log_report",
    "tracking_uri",
    "PaperTable",
    "latex_escape",
    "paper_table",
    "read_results",
    "to_csv",
    "to_latex",
    "environment",
    "figure",
    "interval",
    "interval_svg",
    "markdown_to_html",
    "render_html",
    "write_html",
    "write_report",
]
