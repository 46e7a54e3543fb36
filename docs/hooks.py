"""MkDocs hooks: pages generated from the repository at build time, so they cannot drift.

- ``cli.md``: the ``<!-- cli-reference -->`` marker becomes every command's options, read from
  the typer app (``recjudge.cli._reference``).
- ``findings.md``: ``reports/README.md`` (what the committed reports show against the papers),
  its links into ``reports/`` turned into repository paths (the reports live beside the site,
  not in it).
- ``img/report-screenshot.png``: the committed screenshot of a report in headless Chromium.
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]
REPORTS = ROOT / "reports"
SCREENSHOT = REPORTS / "brief-offline-estimators/ml-1m-qwen2.5-coder-1.5b/report-screenshot.png"
_LINK = re.compile(r"\[([^\]]*)\]\((?!https?://|#)([^)\s]+)\)")


def findings_markdown() -> str:
    """``reports/README.md`` with each relative link written as the repository path it names."""
    text = (REPORTS / "README.md").read_text(encoding="utf-8")
    body = _LINK.sub(lambda m: f"{m.group(1)} (`reports/{m.group(2)}` in the repository)", text)
    head = ("<!-- generated from reports/README.md when the site is built; edit that file -->\n")
    return head + body


def on_files(files, config):
    files.append(File.generated(config, "findings.md", content=findings_markdown()))
    files.append(File.generated(config, "img/report-screenshot.png",
                                abs_src_path=str(SCREENSHOT)))  # fmt: skip
    return files


def on_page_markdown(markdown, page, config, files):
    if "<!-- cli-reference -->" in markdown:
        from recjudge.cli._reference import reference_markdown

        markdown = markdown.replace("<!-- cli-reference -->", reference_markdown())
    return markdown
