"""``recjudge cf``: train, evaluate and recommend with CF models."""

from __future__ import annotations

import json

import typer

from recjudge._registry import UnknownNameError
from recjudge._util import json_loads
from recjudge.cli._app import app, emit, emit_kv, fail

cf_app = typer.Typer(
    help="CF models: SASRec, ALS, BPR, ItemKNN, Pop, FM, DeepFM, LightGCN, NRMS.",
    no_args_is_help=True,
)
app.add_typer(cf_app, name="cf")


@cf_app.command("train")
def cf_train(
    model: str = typer.Argument(
        ..., help="sasrec, als, bpr, itemknn, pop, fm, deepfm, deepfm-nouser, lightgcn or nrms."
    ),
    data: str = typer.Option("ml-1m", "--data", help="Dataset name or saved folder."),
    out: str = typer.Option(..., "--out", help="Output folder (safetensors + JSON)."),
    config: str = typer.Option("{}", "--config", help="JSON overrides, e.g. '{\"epochs\": 50}'"),
    min_rating: float = typer.Option(
        None, "--min-rating", help="Train on ratings >= this only (e.g. 4: liking)."
    ),
    seed: int = typer.Option(0, "--seed", help="Training seed."),
    threads: int = typer.Option(2, "--threads", help="Torch threads."),
    eval_every: int = typer.Option(
        0, "--eval-every", help="SASRec: validation HR@10 every N epochs."
    ),
    signal: str = typer.Option("linear", "--signal", help="linear, sigmoid or exp."),
) -> None:
    """Train on the leave-one-out train split, calibrate sigma on validation, save.

    SASRec checkpoints every epoch in OUT.checkpoint and resumes from it when rerun.
    """
    from recjudge.cf_models import SignalConfig, TrainOptions, train_cf
    from recjudge.data import load_dataset

    try:
        overrides = json_loads(config)
    except json.JSONDecodeError as e:
        fail(f"--config is not JSON ({e.msg}); write e.g. --config '{{\"epochs\": 50}}'")
    try:
        ds = load_dataset(data)
        m = train_cf(
            model,
            ds,
            out,
            overrides,
            TrainOptions(min_rating=min_rating, seed=seed, threads=threads),
            SignalConfig(method=signal),
            eval_every=eval_every,
        )
    except (UnknownNameError, ValueError) as e:
        fail(str(e))
    typer.echo(f"{model}: trained in {m.train_info['train_seconds']:.1f}s, saved to {out}")


@cf_app.command("eval")
def cf_eval(
    path: str,
    data: str = typer.Option(None, "--data", help="Dataset (default: the one trained on)."),
    protocol: str = typer.Option("sampled100", "--protocol", help="sampled100 or full."),
    max_users: int = typer.Option(
        None, "--max-users", help="Evaluate only the first N users (default: all)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON."),
) -> None:
    """Evaluate on the leave-one-out test split (HR@10/NDCG@10 or Recall@k/NDCG@k)."""
    from recjudge.cf_models import eval_saved, load_model, trained_on
    from recjudge.data import load_dataset

    try:
        name = data or trained_on(load_model(path))
        res = eval_saved(path, load_dataset(name), protocol, max_users)
    except (UnknownNameError, ValueError, FileNotFoundError) as e:
        fail(str(e))
    if as_json:
        emit(res)
    else:
        emit_kv(res, 12)


@cf_app.command("recommend")
def cf_recommend(
    path: str,
    k: int = typer.Option(10, "--k", help="Items recommended per user."),
    out: str = typer.Option(..., "--out", help="JSONL with user_id, rank, item_id."),
    data: str = typer.Option(None, "--data", help="Dataset (default: the one trained on)."),
) -> None:
    """Top-k lists for every user, excluding items they have seen."""
    from recjudge.cf_models import load_model, recommend_saved, trained_on
    from recjudge.data import load_dataset

    try:
        name = data or trained_on(load_model(path))
        p = recommend_saved(path, load_dataset(name), k, out)
    except (UnknownNameError, FileNotFoundError) as e:
        fail(str(e))
    typer.echo(f"wrote {p}")
