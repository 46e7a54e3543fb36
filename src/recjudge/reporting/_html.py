"""One self-contained HTML page per report: ``report.html`` beside ``report.md``.

The page is what a person opens in a browser: the report's text and tables (from the same
markdown lines as ``report.md``), its figures inline (PNG files of the report folder as
``data:`` URIs), a header with what produced the numbers, interval plots drawn as inline SVG
from ``results.json``, every table sortable by a click on its header, and ``results.json``
itself embedded (``<script type="application/json" id="rj-results">``) so the page's
numbers can be checked against the file.

Self-contained means: no network fetch, no script from elsewhere. A Content-Security-Policy
meta tag forbids every source but inline styles, inline scripts and ``data:`` images, so a
reference that slipped in would be blocked, not fetched. Every piece of text is HTML-escaped
(item titles are untrusted: a title holding ``<script>`` shows as text); the embedded JSON
escapes ``<`` as ``\\u003c`` so it cannot close its script element.

The page marks itself loaded (``<body data-ready="1">``) when its script has run, and counts
script errors (``data-errors``, with the messages in ``#rj-errors``): what the headless
Chromium test reads.
"""

from __future__ import annotations

import base64
import html
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from recjudge import __version__
from recjudge._util import atomic_write_text
from recjudge.reporting._results import estimates_grid, finite, scores_grid

__all__ = ["interval_svg", "markdown_to_html", "render_html", "write_html"]

CSP = ("default-src 'none'; img-src data:; style-src 'unsafe-inline'; "
       "script-src 'unsafe-inline'")  # fmt: skip

STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:2rem auto;max-width:72rem;
padding:0 1rem;color:#1b1f23;line-height:1.45}
h1{font-size:1.6rem}h2{font-size:1.3rem;margin-top:2rem;border-bottom:1px solid #ddd}
h3{font-size:1.1rem}
table{border-collapse:collapse;margin:.8rem 0;font-size:.88rem}
th,td{border:1px solid #d0d7de;padding:.25rem .5rem;text-align:left;vertical-align:top}
th{background:#f6f8fa;cursor:pointer;user-select:none}th.sorted-asc::after{content:" \\25B2"}
th.sorted-desc::after{content:" \\25BC"}
tr:nth-child(even) td{background:#fbfbfc}
code{background:#f3f4f6;padding:0 .2rem;border-radius:3px;font-size:.9em}
pre{background:#f6f8fa;padding:.6rem;overflow:auto}
img{max-width:100%}
dl.rj-header{display:grid;grid-template-columns:max-content 1fr;gap:.15rem 1rem;
background:#f6f8fa;padding:.6rem 1rem;border-radius:6px}
dl.rj-header dt{font-weight:600}dl.rj-header dd{margin:0}
.rj-plot{margin:1rem 0}
#rj-errors{color:#b00020}
"""

# Sort a table by a header click (numbers numerically, the rest as text); record script
# errors in the page itself, where the headless check reads them.
SCRIPT = """
(function(){
  var errors=[];
  function note(m){errors.push(String(m));document.body.dataset.errors=String(errors.length);
    document.getElementById('rj-errors').textContent=errors.join('\\n');}
  window.addEventListener('error',function(e){note(e.message);});
  // a fetch the page's policy blocked (something referenced from elsewhere)
  document.addEventListener('securitypolicyviolation',function(e){
    note('blocked by the page policy: '+e.blockedURI);});
  function key(t){var m=String(t).replace(/[,%\\s]/g,'').match(/^[-+]?\\d*\\.?\\d+(e[-+]?\\d+)?/i);
    return m?parseFloat(m[0]):null;}
  document.querySelectorAll('table.rj-sortable').forEach(function(table){
    var heads=table.querySelectorAll('thead th');
    heads.forEach(function(th,col){th.addEventListener('click',function(){
      var body=table.tBodies[0],rows=Array.prototype.slice.call(body.rows);
      var asc=!th.classList.contains('sorted-asc');
      heads.forEach(function(h){h.classList.remove('sorted-asc','sorted-desc');});
      th.classList.add(asc?'sorted-asc':'sorted-desc');
      rows.sort(function(a,b){var x=a.cells[col]?a.cells[col].textContent:'',
        y=b.cells[col]?b.cells[col].textContent:'',kx=key(x),ky=key(y),r;
        r=(kx!==null&&ky!==null)?kx-ky:x.localeCompare(y);return asc?r:-r;});
      rows.forEach(function(r){body.appendChild(r);});});});});
  document.body.dataset.errors=String(errors.length);
  document.body.dataset.ready='1';
})();
"""

# Neither part may hold its own opening bracket: each match attempt then stops at the next
# "[" or "(", so a line is read in linear time (with "[^\]]+", 50,000 "[" then 50,000 "]("
# took minutes: every "[" rescanned the rest of the line).
_IMAGE = re.compile(r"!\[([^\[\]]*)\]\(([^()\s]+)\)")
_LINK = re.compile(r"\[([^\[\]]+)\]\(([^()\s]+)\)")


def _inline(text: str, folder: Path | None) -> str:
    """One line of markdown to HTML: escaped first, then images (inline ``data:`` PNG/SVG
    of files inside ``folder`` only), links (text only: no navigation away), code, bold,
    italics."""
    out = html.escape(text, quote=True)

    def image(m: re.Match[str]) -> str:
        alt, src = m.group(1), html.unescape(m.group(2))
        data = _data_uri(folder, src)
        if data is None:
            return f"<em>[figure {html.escape(src)} not found]</em>"
        return f'<img alt="{alt}" src="{data}">'

    out = _IMAGE.sub(image, out)
    out = _LINK.sub(lambda m: f'<span class="rj-link" title="{_link_title(m.group(2))}">'
                              f"{m.group(1)}</span>", out)  # fmt: skip
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", out)
    out = re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", out)
    out = re.sub(r"(?<![\w*])\*([^*\s][^*]*)\*(?![\w*])", r"<em>\1</em>", out)
    out = re.sub(r"(?<![\w])_([^_\s][^_]*)_(?![\w])", r"<em>\1</em>", out)
    return out


#: link schemes whose target is code, not a place: never put into an attribute, even a title
_SCRIPT_SCHEMES = ("javascript", "vbscript", "data", "file")


def _link_title(target: str) -> str:
    """A link's (escaped) target as the span's title, or what it was when its scheme runs code
    (a fuzz find: ``[a](JavaScript:x)`` became ``title="JavaScript:x"``)."""
    scheme = html.unescape(target).strip().partition(":")[0].strip().lower()
    if ":" in html.unescape(target) and scheme in _SCRIPT_SCHEMES:
        return f"a {scheme} link, not shown"
    return target


def _data_uri(folder: Path | None, src: str) -> str | None:
    """A figure of the report folder as a ``data:`` URI; None for anything outside it (a
    ``..`` or absolute path, a symlink out of it), missing, or not PNG/SVG."""
    if folder is None or "://" in src:
        return None
    base = folder.resolve()
    try:
        path = (base / src).resolve()
        path.relative_to(base)
    except (ValueError, OSError):
        return None
    kind = {".png": "image/png", ".svg": "image/svg+xml"}.get(path.suffix.lower())
    if kind is None or not path.is_file():
        return None
    return f"data:{kind};base64,{base64.b64encode(path.read_bytes()).decode('ascii')}"


def _cells(line: str) -> list[str]:
    body = line.strip()
    body = body[1:] if body.startswith("|") else body
    body = body[:-1] if body.endswith("|") else body
    return [c.strip() for c in re.split(r"(?<!\\)\|", body)]


def _is_rule(line: str) -> bool:
    return bool(re.fullmatch(r"\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?", line.strip()))


def _table(lines: Sequence[str], i: int, folder: Path | None) -> tuple[str, int]:
    """The pipe table starting at line ``i`` (its header, the rule, its rows) as a sortable
    HTML table, and the line after it."""
    head = _cells(lines[i].strip())
    rows = []
    j = i + 2
    while j < len(lines) and lines[j].strip().startswith("|"):
        rows.append(_cells(lines[j]))
        j += 1
    block = ('<table class="rj-sortable"><thead><tr>'
             + "".join(f"<th>{_inline(c, folder)}</th>" for c in head)
             + "</tr></thead><tbody>"
             + "".join("<tr>" + "".join(f"<td>{_inline(c, folder)}</td>" for c in r)
                       + "</tr>" for r in rows)
             + "</tbody></table>")  # fmt: skip
    return block, j


def _bullets(lines: Sequence[str], i: int, folder: Path | None) -> tuple[str, int]:
    """The bullet list starting at line ``i`` (an item continues on lines indented by two
    spaces) as HTML, and the line after it."""
    n = len(lines)
    items = []
    while i < n and re.match(r"[-*]\s+", lines[i].strip()):
        item = [re.sub(r"^[-*]\s+", "", lines[i].strip())]
        i += 1
        while i < n and lines[i].startswith("  ") and lines[i].strip() and not re.match(
                r"[-*]\s+", lines[i].strip()):  # fmt: skip
            item.append(lines[i].strip())
            i += 1
        items.append("<li>" + " ".join(_inline(x, folder) for x in item) + "</li>")
    return "<ul>" + "".join(items) + "</ul>", i


def markdown_to_html(lines: Sequence[str], folder: Path | None = None) -> str:
    """The subset of markdown recjudge's reports write (headings, paragraphs, bullet lists,
    pipe tables, fenced code, images, code, bold, italics) as HTML; tables are sortable."""
    out: list[str] = []
    i, n = 0, len(lines)
    para: list[str] = []

    def flush() -> None:
        if para:
            out.append("<p>" + " ".join(_inline(p, folder) for p in para) + "</p>")
            para.clear()

    while i < n:
        line = lines[i]
        s = line.strip()
        if s.startswith("```"):
            flush()
            j = i + 1
            while j < n and not lines[j].strip().startswith("```"):
                j += 1
            out.append("<pre><code>" + html.escape("\n".join(lines[i + 1 : j])) + "</code></pre>")
            i = j + 1
            continue
        m = re.match(r"(#{1,6})\s+(.*)", s)
        if m:
            flush()
            level = len(m.group(1))
            out.append(f"<h{level}>{_inline(m.group(2), folder)}</h{level}>")
            i += 1
            continue
        if s.startswith("|") and i + 1 < n and _is_rule(lines[i + 1]):
            flush()
            block, i = _table(lines, i, folder)
            out.append(block)
            continue
        if re.match(r"[-*]\s+", s):
            flush()
            block, i = _bullets(lines, i, folder)
            out.append(block)
            continue
        if not s:
            flush()
        else:
            para.append(s)
        i += 1
    flush()
    return "\n".join(out)


def interval_svg(rows: Sequence[tuple[str, float, float | None, float | None]], title: str,
                 width: int = 640) -> str:  # fmt: skip
    """A horizontal interval plot as inline SVG: one row per ``(label, value, lo, hi)``, a
    dot at the value and a bar from ``lo`` to ``hi`` (no bar where the interval is None)."""
    rows = [(lab, v, lo, hi) for lab, v, lo, hi in rows if finite(v) is not None]
    if not rows:
        return ""
    vals = [x for _, v, lo, hi in rows for x in (v, lo, hi) if finite(x) is not None]
    lo_all, hi_all = min(vals), max(vals)
    if hi_all == lo_all:
        lo_all, hi_all = lo_all - 0.5, hi_all + 0.5
    pad = 0.05 * (hi_all - lo_all)
    lo_all, hi_all = lo_all - pad, hi_all + pad
    left, right, step, top = 230, 20, 22, 28
    h = top + step * len(rows) + 30
    span = width - left - right

    def x(v: float) -> float:
        return left + span * (v - lo_all) / (hi_all - lo_all)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="rj-plot" width="{width}" '
             f'height="{h}" role="img" aria-label="{html.escape(title)}">',
             f'<text x="{left}" y="16" font-size="13" font-weight="600">{html.escape(title)}'
             "</text>"]  # fmt: skip
    for k, (lab, v, lo, hi) in enumerate(rows):
        y = top + step * k + 10
        parts.append(f'<text x="{left - 8}" y="{y + 4}" font-size="11" text-anchor="end">'
                     f"{html.escape(str(lab))}</text>")  # fmt: skip
        if finite(lo) is not None and finite(hi) is not None:
            parts.append(f'<line x1="{x(lo):.1f}" x2="{x(hi):.1f}" y1="{y}" y2="{y}" '
                         'stroke="#4c72b0" stroke-width="2"/>')  # fmt: skip
            for end in (lo, hi):
                parts.append(f'<line x1="{x(end):.1f}" x2="{x(end):.1f}" y1="{y - 4}" '
                             f'y2="{y + 4}" stroke="#4c72b0" stroke-width="1.5"/>')  # fmt: skip
        parts.append(f'<circle cx="{x(v):.1f}" cy="{y}" r="3.5" fill="#c44e52">'
                     f"<title>{html.escape(str(lab))}: {v:.4g}</title></circle>")  # fmt: skip
    axis_y = top + step * len(rows) + 8
    parts.append(f'<line x1="{left}" x2="{width - right}" y1="{axis_y}" y2="{axis_y}" '
                 'stroke="#999"/>')  # fmt: skip
    for t in range(5):
        v = lo_all + (hi_all - lo_all) * t / 4
        parts.append(f'<text x="{x(v):.1f}" y="{axis_y + 16}" font-size="10" '
                     f'text-anchor="middle">{v:.3g}</text>')  # fmt: skip
    parts.append("</svg>")
    return "".join(parts)


def _interval_rows(results: Mapping[str, Any]) -> list[tuple[str, list[tuple]]]:
    """(title, rows) of the interval plots a results.json supports: ``evaluate``'s metrics
    per qrels kind and its estimators (systems x estimators per metric)."""
    plots: dict[str, list[tuple]] = {}
    for kind, system, m, v, lo, hi in scores_grid(results):
        plots.setdefault(f"{m}, {kind} feedback (95 % user interval)", []).append(
            (system, v, lo, hi))  # fmt: skip
    for system, m, name, v, lo, hi in estimates_grid(results):
        plots.setdefault(f"{m}: systems x estimators (95 % interval)", []).append(
            (f"{system} / {name}", v, lo, hi))  # fmt: skip
    return list(plots.items())


def _number_table(results: Mapping[str, Any]) -> str:
    """Every interval-bearing number of an evaluate-style results.json, one row each, with
    its JSON path and values as data attributes (what the page check compares)."""
    rows = [(f"scores.{k}.{s}.{m}", f"{k} / {s} / {m}", v, lo, hi)
            for k, s, m, v, lo, hi in scores_grid(results)]  # fmt: skip
    rows += [(f"estimators.systems.{s}.{m}.{e}", f"{s} / {m} / {e}", v, lo, hi)
             for s, m, e, v, lo, hi in estimates_grid(results)]  # fmt: skip
    if not rows:
        return ""

    def cell(v: Any) -> str:
        x = finite(v)
        shown = "-" if x is None else f"{x:.4f}"
        attr = "" if x is None else f' data-value="{x!r}"'
        return f"<td{attr}>{shown}</td>"

    body = "".join(
        f'<tr data-path="{html.escape(path)}"><td>{html.escape(label)}</td>{cell(v)}{cell(lo)}'
        f"{cell(hi)}</tr>"
        for path, label, v, lo, hi in rows
    )
    return ('<h2>Every number with its interval</h2><table class="rj-sortable" id="rj-numbers">'
            "<thead><tr><th>quantity</th><th>value</th><th>95 % lo</th><th>95 % hi</th></tr>"
            f"</thead><tbody>{body}</tbody></table>")  # fmt: skip


#: what the page header shows, found in results.json's config / job / environment
HEADER_FIELDS = ("model", "llm", "mode", "beta", "cf", "judge", "estimators", "propensities",
                 "clip", "calibration", "gold", "qrels", "dtype", "device", "backend",
                 "data")  # fmt: skip


def _header(results: Mapping[str, Any]) -> str:
    found: dict[str, Any] = {}
    for part in ("judge", "job", "config"):
        d = results.get(part)
        if isinstance(d, Mapping):
            for k in HEADER_FIELDS:
                if k in d and d[k] not in (None, "", [], {}) and k not in found:
                    found[k] = d[k]
    found.update(_estimator_fields(results.get("estimators")))
    env = results.get("environment") or {}
    found["recjudge"] = __version__
    for k in ("torch", "cpu", "native_bf16", "gpu", "date"):
        if isinstance(env, Mapping) and env.get(k) not in (None, ""):
            found[k] = env[k]
    items = "".join(f"<dt>{html.escape(str(k))}</dt><dd>{html.escape(_short(v))}</dd>"
                    for k, v in found.items())  # fmt: skip
    return f'<dl class="rj-header">{items}</dl>'


def _estimator_fields(est: Any) -> dict[str, Any]:
    """What an evaluate report's header says about its estimators: the lead one, the
    propensities, the calibration and the gold sample."""
    found: dict[str, Any] = {}
    if not isinstance(est, Mapping):
        return found
    lead = est.get("lead")
    if isinstance(lead, Mapping) and lead.get("estimator"):
        found["lead estimator"] = lead["estimator"]
    for k, label in (("propensities", "propensities"), ("calibration", "calibration"),
                     ("gold", "gold sample")):  # fmt: skip
        v = est.get(k)
        if isinstance(v, str | int | float) and v != "":
            found[label] = v
    return found


def _short(v: Any) -> str:
    s = v if isinstance(v, str) else json.dumps(v, default=str)
    return s if len(s) <= 300 else s[:297] + "..."


def render_html(results: Mapping[str, Any], lines: Sequence[str], folder: Path | None = None,
                title: str | None = None) -> str:  # fmt: skip
    """The whole page (see the module docstring)."""
    if title is None:
        title = next((ln.lstrip("# ").strip() for ln in lines if ln.startswith("#")), "report")
    plots = "".join(interval_svg(rows, t) for t, rows in _interval_rows(results))
    named = {m.group(2) for ln in lines for m in _IMAGE.finditer(ln)}
    extra = sorted(p.name for p in folder.glob("*.png") if p.name not in named) if folder else []
    inline = {n: _data_uri(folder, n) for n in extra}  # each file read and encoded once
    figures = "".join(f'<figure><img alt="{html.escape(n)}" src="{uri}">'
                      f"<figcaption>{html.escape(n)}</figcaption></figure>"
                      for n, uri in inline.items() if uri)  # fmt: skip
    blob = json.dumps(results, default=str, allow_nan=True).replace("<", "\\u003c")
    blob = blob.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head>"
        '<body data-ready="0" data-errors="0">'
        f"{_header(results)}"
        f"{markdown_to_html(lines, folder)}"
        + (f"<h2>Figures</h2>{figures}" if figures else "")
        + (f"<h2>Intervals</h2>{plots}" if plots else "")
        + _number_table(results)
        + '<pre id="rj-errors"></pre>'
        f'<script type="application/json" id="rj-results">{blob}</script>'
        f"<script>{SCRIPT}</script></body></html>\n"
    )


def write_html(out: str | Path, results: Mapping[str, Any], lines: Sequence[str]) -> Path:
    """Write ``report.html`` under ``out`` (atomically) and return its path."""
    out = Path(out)
    path = out / "report.html"
    atomic_write_text(path, render_html(results, lines, out))
    return path
