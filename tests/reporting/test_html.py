"""``report.html``: self-contained, escaped, and the same numbers as ``results.json``; opened
in headless Chromium (Debian's ``chromium``; skipped where absent, installed in CI): it
loads without script errors, takes a screenshot, and its DOM holds results.json's numbers."""

from __future__ import annotations

import html.parser
import json
import subprocess
from pathlib import Path

from report_world import write_toy_world

from cli_in_process import run_cli
from headless import chromium, needs_chromium
from recjudge.reporting import interval_svg, markdown_to_html, render_html, write_report
from recjudge.reporting._html import _inline

HOSTILE = '<script>alert("x")</script> & "Heat" (1995)'


def _browser(page: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
           "--disable-extensions", "--enable-logging=stderr", "--v=0", *args,
           page.resolve().as_uri()]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


class _Dom(html.parser.HTMLParser):
    """The body's data attributes, the numbers table's rows, all text, and script bodies."""

    def __init__(self):
        super().__init__()
        self.body: dict[str, str] = {}
        self.rows: list[dict] = []
        self.text: list[str] = []
        self.scripts: list[str] = []
        self._in_script = False
        self._row: dict | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "body":
            self.body = a
        if tag == "tr" and "data-path" in a:
            self._row = {"path": a["data-path"], "values": []}
            self.rows.append(self._row)
        if tag == "td" and self._row is not None:
            self._row["values"].append(a.get("data-value"))
        if tag == "script":
            self._in_script = True
            self.scripts.append("")

    def handle_endtag(self, tag):
        if tag == "script":
            self._in_script = False
        if tag == "tr":
            self._row = None

    def handle_data(self, data):
        if self._in_script:
            self.scripts[-1] += data
        else:
            self.text.append(data)


def _dom(text: str) -> _Dom:
    d = _Dom()
    d.feed(text)
    return d


def test_markdown_is_escaped_and_figures_stay_inside_the_folder(tmp_path):
    (tmp_path / "fig.png").write_bytes(b"\x89PNG\r\n\x1a\nfake")
    outside = tmp_path.parent / "secret.png"
    outside.write_bytes(b"\x89PNG\r\n\x1a\nsecret")
    got = markdown_to_html([
        "# Title", "", "| system | title |", "|---|---|", f"| a | {HOSTILE} |", "",
        "![ok](fig.png)", "![no](../secret.png)", "![no](/etc/passwd)", "- **bold** and `code`",
    ], tmp_path)  # fmt: skip
    assert "<script>" not in got and "&lt;script&gt;" in got
    assert got.count("data:image/png;base64,") == 1  # fig.png only
    assert "[figure ../secret.png not found]" in got and "<strong>bold</strong>" in got
    assert '<table class="rj-sortable">' in got and "<code>code</code>" in got


def test_the_page_forbids_every_outside_source_and_embeds_results_safely():
    results = {"note": "</script><script>alert(1)</script>", "x": 1.5}
    page = render_html(results, ["# T"])
    assert "Content-Security-Policy" in page and "default-src 'none'" in page
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "https://" not in page
    d = _dom(page)
    blob = next(s for s in d.scripts if s.lstrip().startswith("{"))
    assert json.loads(blob) == results  # \u003c decodes back; nothing closed the element
    assert "alert(1)" not in "".join(d.scripts[-1:])


def test_interval_plot_draws_one_row_per_estimate():
    svg = interval_svg([("a", 0.2, 0.1, 0.3), ("b", 0.4, None, None), ("c", None, 0, 1)], "t")
    assert svg.count("<circle") == 2 and svg.count('stroke-width="2"') == 1


def _evaluate_folder(tmp_path) -> Path:
    """A real `recjudge evaluate` report (logged feedback, two systems)."""
    write_toy_world(tmp_path)
    r = run_cli("evaluate", "--runs", f"a={tmp_path}/a.jsonl,b={tmp_path}/b.jsonl", "--feedback",
                str(tmp_path / "ds"), "--k", "5", "--metrics", "ndcg@5,precision@5",
                "--min-rating", "3", "--out", str(tmp_path / "ev"))  # fmt: skip
    assert r.code == 0, r.stderr
    return tmp_path / "ev"


def _floats(values) -> list:
    """Numbers rounded to 12 digits (None stays None): what a data-value round-trips."""
    return [None if v is None else round(float(v), 12) for v in values]


def _value_at(results: dict, path: str):
    """results.json's value at a data-path (keys may hold dots: match greedily)."""
    node, rest = results, path
    while rest:
        for k in sorted((k for k in node if rest == k or rest.startswith(k + ".")), key=len,
                        reverse=True):  # fmt: skip
            node, rest = node[k], rest[len(k) + 1 :]
            break
        else:
            raise KeyError(path)
    return node


def test_an_evaluate_report_holds_every_number_of_its_results(tmp_path):
    out = _evaluate_folder(tmp_path)
    results = json.loads((out / "results.json").read_text())
    d = _dom((out / "report.html").read_text())
    assert d.rows, "no numbers table"
    for row in d.rows:
        value = _value_at(results, row["path"])
        lo, hi = results["intervals"][row["path"].split(".")[1]][row["path"].split(".")[2]][
            row["path"].split(".", 3)[3]]  # fmt: skip
        assert _floats(row["values"][1:]) == _floats([value, lo, hi]), row
    kinds = results["scores"]
    assert len(d.rows) == sum(len(m) for s in kinds.values() for m in s.values())
    assert "data:image/png;base64," in (out / "report.html").read_text()  # evaluate.png inline


@needs_chromium
def test_the_report_opens_in_headless_chromium_without_errors(tmp_path):
    out = _evaluate_folder(tmp_path)
    page = out / "report.html"
    lines = (out / "report.md").read_text().splitlines() + ["", f"A title: {HOSTILE}"]
    write_report(out, json.loads((out / "results.json").read_text()), lines)  # with the title
    r = _browser(page, "--dump-dom")
    assert r.returncode == 0, r.stderr[-2000:]
    d = _dom(r.stdout)
    assert d.body.get("data-ready") == "1", r.stdout[-2000:]
    assert d.body.get("data-errors") == "0", r.stdout[-2000:]
    assert "Uncaught" not in r.stderr and "Refused to" not in r.stderr
    assert HOSTILE in "".join(d.text)  # shown as text, never run
    assert not any("alert(" in s for s in d.scripts)
    results = json.loads((out / "results.json").read_text())
    for row in d.rows:
        assert _floats(row["values"][1:2]) == _floats([_value_at(results, row["path"])])
    shot = tmp_path / "shot.png"
    r = _browser(page, f"--screenshot={shot}", "--window-size=1280,2400",
                 "--hide-scrollbars")  # fmt: skip
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000


@needs_chromium
def test_the_headless_check_sees_a_script_error(tmp_path):
    page = tmp_path / "report.html"
    text = render_html({"x": 1}, ["# T"])
    page.write_text(text.replace("</body>", "<script>undefined_function()</script></body>"))
    d = _dom(_browser(page, "--dump-dom").stdout)
    assert d.body.get("data-errors") == "1"
    assert "undefined_function" in "".join(d.text)


def test_every_committed_report_renders(tmp_path):
    """Reports use `scores`, `intervals` and `estimators` for other shapes too (GIST, the
    benches): the page renders whatever results.json holds, its numbers table only for the
    evaluate shape."""
    root = Path(__file__).parents[2] / "reports"
    done = 0
    for res in sorted(root.rglob("results.json")):
        md = res.parent / "report.md"
        if not md.is_file():
            continue
        page = render_html(json.loads(res.read_text()), md.read_text().splitlines(), res.parent)
        assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
        done += 1
    assert done >= 10
    odd = {"scores": {"x": 0.5, "y": {"s": 3}}, "intervals": 3, "estimators": [1]}
    assert "rj-numbers" not in render_html(odd, ["# T"])


def test_a_line_of_50000_brackets_renders_at_once_and_links_still_work():
    """Issue 91: 50,000 "[" then 50,000 "](" on one report line took minutes (every "["
    rescanned the line); each match attempt now stops at the next bracket."""
    hostile = "[" * 50_000 + "](" * 50_000
    out = _inline(hostile, None)
    assert out.count("[") == 50_000 and out.count("](") == 50_000  # nothing taken as a link
    link = _inline("see [the docs](https://x.org/a)", None)
    assert '<span class="rj-link" title="https://x.org/a">the docs</span>' in link
