"""The command line as data: every command with its options, read from the typer app itself.

Two readers: the docs site's CLI reference page (``docs/hooks.py`` renders
:func:`reference_markdown` at build time, so the page cannot drift from the code) and the docs
tests, which resolve every ``recjudge ...`` line the pages show with :func:`resolve` and fail
on a command or option that does not exist.
"""

from __future__ import annotations

from dataclasses import dataclass

import typer

from recjudge.cli._app import _register_extensions, app

__all__ = ["CommandDoc", "OptionDoc", "commands", "reference_markdown", "resolve"]


@dataclass(frozen=True)
class OptionDoc:
    """One parameter of a command: its flags (empty for an argument), metavar and help."""

    names: tuple[str, ...]
    argument: str
    help: str
    default: str
    required: bool
    switch: bool  # a flag that takes no value (``--json``, ``--resume/--no-resume``)


@dataclass(frozen=True)
class CommandDoc:
    """One command: its words after ``recjudge``, help text, parameters and subcommands."""

    path: tuple[str, ...]
    help: str
    options: tuple[OptionDoc, ...]
    subcommands: tuple[str, ...]
    passes_on: bool = False  # unknown options go on to another program (`serve` -> vLLM)

    def flags(self) -> set[str]:
        """Every flag the command accepts (``--help`` included)."""
        return {n for o in self.options for n in o.names} | {"--help"}


def _tree():
    # Every command module attached (a bare `recjudge --help` does the same).
    _register_extensions()
    return typer.main.get_command(app)


def _option(param) -> OptionDoc:
    is_option = param.param_type_name == "option"
    names = tuple(param.opts) + tuple(param.secondary_opts) if is_option else ()
    default = param.default
    shown = "" if default is None or callable(default) or default == () else str(default)
    return OptionDoc(
        names=names,
        argument="" if is_option else (param.name or "").upper(),
        help=" ".join((getattr(param, "help", None) or "").split()),
        default=shown,
        required=bool(param.required),
        switch=bool(is_option and param.is_flag),
    )


def commands() -> dict[tuple[str, ...], CommandDoc]:
    """Every command and group of ``recjudge``, by its words (``()`` is the root)."""
    out: dict[tuple[str, ...], CommandDoc] = {}

    def walk(cmd, path: tuple[str, ...]) -> None:
        subs = dict(cmd.commands) if isinstance(cmd, typer.core.TyperGroup) else {}
        hidden = {n for n, c in subs.items() if c.hidden}
        out[path] = CommandDoc(
            path=path,
            help=(cmd.help or "").strip(),
            options=tuple(_option(p) for p in cmd.params),
            subcommands=tuple(sorted(set(subs) - hidden)),
            passes_on=bool(cmd.context_settings.get("ignore_unknown_options")),
        )
        for name, sub in subs.items():
            if name not in hidden:
                walk(sub, (*path, name))

    walk(_tree(), ())
    return out


def resolve(argv: list[str], table: dict[tuple[str, ...], CommandDoc] | None = None):
    """The command ``recjudge ARGV`` runs and the flags it was given that it does not have.

    Global options (before the command's name) are checked against the root's. Returns
    ``(path, unknown)``; ``path`` is None when the words name no command (``unknown`` then
    holds the first word that is not one).
    """
    table = commands() if table is None else table
    path: tuple[str, ...] = ()
    unknown: list[str] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        here = table[path]
        if word == "...":  # the docs' "and the options shown before" placeholder
            i += 1
            continue
        if word.startswith("-"):
            flag = word.split("=", 1)[0]
            if flag not in here.flags() and not here.passes_on:
                unknown.append(flag)
            i += 1
            # the option's value, when the flag takes one (not a boolean switch)
            if "=" not in word and i < len(argv) and not _is_switch(here, flag):
                i += 1
            continue
        if here.subcommands and word in here.subcommands:
            path = (*path, word)
        elif here.subcommands and not _has_arguments(here):
            return None, [word]
        i += 1
    return path, unknown


def _is_switch(cmd: CommandDoc, flag: str) -> bool:
    return flag == "--help" or any(o.switch for o in cmd.options if flag in o.names)


def _has_arguments(cmd: CommandDoc) -> bool:
    return any(not o.names for o in cmd.options)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ").replace("<", "&lt;")


def reference_markdown() -> str:
    """The CLI reference page's body: one section per command, its help and an options table
    (flags, default, help), in the order ``recjudge --help`` lists them."""
    table = commands()
    lines: list[str] = []
    for path, doc in table.items():
        title = " ".join(("recjudge", *path))
        lines += [f"{'#' * min(2 + max(len(path) - 1, 0), 4)} `{title}`", ""]
        if doc.help:
            lines += [_cell(doc.help.split("\n\n")[0]), ""]
        if doc.subcommands:
            lines += ["Subcommands: " + ", ".join(f"`{s}`" for s in doc.subcommands) + ".", ""]
        if doc.options:
            lines += ["| option | default | what it does |", "|---|---|---|"]
            for o in doc.options:
                name = " / ".join(f"`{n}`" for n in o.names) if o.names else f"`{o.argument}`"
                req = " (required)" if o.required else ""
                lines.append(f"| {name}{req} | {_cell(o.default)} | {_cell(o.help)} |")
            lines.append("")
    return "\n".join(lines)
