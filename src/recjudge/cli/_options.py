"""Command-line options built from a config class: one ``--option`` per field.

The commands of the registered jobs (``impute``, ``evaluate``, ``augment``) and benchmarks
(``bench NAME``) take exactly their config's fields, so the command line, ``recjudge run`` /
``bench run --config FILE`` and the library accept the same settings and check them in one
place, the config's validators. A field's help is its ``description``, else its line in the
class docstring's ``Attributes:`` section; tuples are given comma-separated, Literals as text;
a field holding a nested config (GISTBench's ``predicate``) is given as JSON; a field may add
older option names in ``json_schema_extra={"cli": ["--old-name"]}``.
"""

from __future__ import annotations

import inspect
import json
import re
import types
from typing import Any, Union, get_args, get_origin

import typer
from pydantic import BaseModel, ValidationError

from recjudge._util import comma_list, json_loads
from recjudge.cli._app import fail, option_errors


def _option_type(annotation: Any) -> tuple[Any, bool]:
    """(the type the command line parses, whether the field may be None)."""
    optional = False
    if get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        optional = len(args) < len(get_args(annotation))
        annotation = args[0] if len(args) == 1 else str
    if annotation in (str, int, float, bool):
        return annotation, optional
    return str, optional  # tuple[...], Literal[...], anything else: text the config parses


def _is_tuple(annotation: Any) -> bool:
    if get_origin(annotation) in (Union, types.UnionType):
        return any(_is_tuple(a) for a in get_args(annotation))
    return get_origin(annotation) is tuple


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _attribute_docs(cls: type) -> dict[str, str]:
    """``{field: text}`` from the Google-style ``Attributes:`` sections along the MRO."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        doc = inspect.cleandoc(klass.__dict__.get("__doc__") or "")
        if "Attributes:" not in doc:
            continue
        section = doc.split("Attributes:", 1)[1]
        name, lines = None, []
        for line in section.splitlines():
            if line.strip() and not line.startswith(" "):
                break  # the next section
            m = re.match(r"^ {4}(\w+)(?: \([^)]*\))?: (.*)$", line)
            if m:
                if name:
                    out[name] = " ".join(lines)
                name, lines = m.group(1), [m.group(2).strip()]
            elif name and line.strip():
                lines.append(line.strip())
        if name:
            out[name] = " ".join(lines)
    return out


def config_parameters(
    cls: type[BaseModel], exclude: tuple[str, ...] = ()
) -> list[inspect.Parameter]:
    """One keyword parameter with a ``typer.Option`` per field of ``cls`` (but ``exclude``,
    which keep their defaults): the required ones (the inputs) first, then the fields ``cls``
    declares itself (what a job runs on), then the inherited ones (shared options such as the
    judge's), each in the config's order."""
    docs = _attribute_docs(cls)
    params = []
    own = set(cls.__dict__.get("__annotations__", {}))
    fields = sorted(cls.model_fields.items(),
                    key=lambda kv: (not kv[1].is_required(), kv[0] not in own))  # fmt: skip
    for name, field in fields:
        if name in exclude:
            continue
        typ, optional = _option_type(field.annotation)
        unset = optional and field.default is not None and typ is not bool
        if unset:  # the command line says None as 'none' (a number option could not)
            typ = str
        if field.is_required():
            default: Any = ...
        elif isinstance(field.default, tuple):
            default = ",".join(map(str, field.default))
        elif isinstance(field.default, BaseModel):
            default = json.dumps(field.default.model_dump())
        else:
            default = field.default
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        flag = "--" + name.replace("_", "-")
        if typ is bool and default is True:  # a flag that is on unless --no-NAME
            flag = f"{flag}/--no-{name.replace('_', '-')}"
        names = [flag, *extra.get("cli", [])]  # type: ignore[misc]
        text = (field.description or docs.get(name, "")).replace("``", "'")
        if unset:
            text += " 'none' unsets it."
        option = typer.Option(default, *names, help=text[:1].upper() + text[1:])
        params.append(
            inspect.Parameter(
                name,
                inspect.Parameter.KEYWORD_ONLY,
                default=option,
                annotation=typ | None if optional else typ,
            )
        )
    return params


def config_from_options(cls: type[BaseModel], options: dict[str, Any]) -> Any:
    """``cls`` from the parsed options (comma-separated tuples split, nested configs read as
    JSON); a bad value exits with one ``--option: problem`` line."""
    values = dict(options)
    for name, field in cls.model_fields.items():
        v = values.get(name)
        if isinstance(v, str) and v.strip().lower() == "none" and not field.is_required():
            values[name] = None  # an optional field unset on the command line
        elif isinstance(v, str) and _is_tuple(field.annotation):
            values[name] = comma_list(v)
        elif isinstance(v, str) and _is_model(field.annotation):
            try:
                values[name] = json_loads(v)
            except json.JSONDecodeError as e:
                keys = ", ".join(field.annotation.model_fields)
                fail(f"--{name.replace('_', '-')}: not JSON ({e.msg}); give an object with "
                     f"some of {keys}, e.g. '{field.default.model_dump_json()}'")  # fmt: skip
    try:
        return cls(**values)
    except ValidationError as e:
        fail(option_errors(e))
    raise AssertionError  # fail() exits


def command_from_config(
    cls: type[BaseModel],
    body: Any,
    doc: str,
    name: str,
    extra: list[inspect.Parameter] = (),  # type: ignore[assignment]
    exclude: tuple[str, ...] = (),
) -> Any:
    """A typer command whose options are ``cls``'s fields (but ``exclude``) plus ``extra``;
    it calls ``body(config, **extra_values)``."""
    extra_names = [p.name for p in extra]

    def command(**options: Any) -> None:
        rest = {n: options.pop(n) for n in extra_names}
        body(config_from_options(cls, options), **rest)

    params = [*config_parameters(cls, exclude), *extra]
    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__doc__ = doc
    command.__name__ = name.replace("-", "_") + "_cmd"
    return command


def flag(name: str, decl: str, help_: str) -> inspect.Parameter:
    """An extra boolean option (``--json``) for ``command_from_config``."""
    return inspect.Parameter(
        name,
        inspect.Parameter.KEYWORD_ONLY,
        default=typer.Option(False, decl, help=help_),
        annotation=bool,
    )


def count_option(name: str, decl: str, help_: str) -> inspect.Parameter:
    """An extra optional count (``--users N``, at least 1; unset: ``None``) for
    ``command_from_config``."""
    return inspect.Parameter(
        name,
        inspect.Parameter.KEYWORD_ONLY,
        default=typer.Option(None, decl, min=1, help=help_),
        annotation=int | None,
    )


def text_option(name: str, decl: str, help_: str, default: Any = None) -> inspect.Parameter:
    """An extra text option (``--out``; ``default`` ``...``: required) for
    ``command_from_config``."""
    return inspect.Parameter(
        name,
        inspect.Parameter.KEYWORD_ONLY,
        default=typer.Option(default, decl, help=help_),
        annotation=str if default is not None else str | None,
    )
