"""Fuzz: the report's markdown-to-HTML renderer on hostile lines. Whatever a report line holds
(a run name, a title, a note), the page gets only the renderer's own tags and attributes: no
element, attribute or URL from the text, no event handler, no script."""

from __future__ import annotations

import html.parser

from _fuzz import FUZZ, texts
from hypothesis import example, given
from hypothesis import strategies as st

from recjudge.reporting import markdown_to_html

#: what the renderer itself writes
TAGS = {"h1", "h2", "h3", "h4", "h5", "h6", "p", "ul", "ol", "li", "table", "thead", "tbody",
        "tr", "th", "td", "pre", "code", "strong", "em", "span", "img", "div", "br", "b", "i",
        "button"}  # fmt: skip
ATTRS = {"class", "title", "alt", "src", "id", "data-sort", "data-col", "type", "aria-sort",
         "scope", "data-value"}  # fmt: skip

pieces = st.sampled_from(["# ", "## ", "- ", "* ", "| a | b |", "|---|---|", "```", "`", "**",
                          "*", "_", "[", "](", "![", ")", "<", ">", "&", '"', "'", "\\",
                          "javascript:", "data:", "onerror=", "<script>", "</script>",
                          "<img src=x onerror=alert(1)>", "\u2028", "\n"])  # fmt: skip
lines = st.lists(st.lists(st.one_of(pieces, texts), max_size=8).map("".join), max_size=8)


class _Tags(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


@FUZZ
@given(lines)
@example(["[# ](javascript:)"])  # found by this target at 50,000 examples (issue 111)
@example(["[a](JavaScript:x)"])
@example(["[b](vbscript:y) [c](DATA:text/html,z)"])
def test_hostile_report_lines_become_only_the_renderers_own_markup(report_lines):
    page = markdown_to_html(report_lines)
    parser = _Tags()
    parser.feed(page)
    for tag, attrs in parser.tags:
        assert tag in TAGS, (tag, page[:500])
        assert set(attrs) <= ATTRS, (attrs, page[:500])
        for name, value in attrs.items():
            v = (value or "").strip().lower()
            assert not v.startswith(("javascript:", "vbscript:")), (name, value)
            if name == "src":
                assert v.startswith("data:image/"), value  # figures inline, nothing fetched
