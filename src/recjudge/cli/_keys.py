"""``recjudge keys``: Ed25519 keys that vouch for tuned model folders and checkpoints."""

from __future__ import annotations

import os
from pathlib import Path

import typer

from recjudge._signing import (
    SIGNING_KEY_ENV,
    TRUSTED_KEYS_ENV,
    SignatureError,
    generate_keypair,
    trusted_keys,
)
from recjudge.cli._app import app, emit, emit_kv, fail

keys_app = typer.Typer(
    help="Signing keys: a team signs its tuned judge folders and checkpoints; anyone with "
    "the public key verifies them ($RECJUDGE_TRUSTED_KEYS).",
    no_args_is_help=True,
)
app.add_typer(keys_app, name="keys")


@keys_app.command("generate")
def keys_generate(
    out: str = typer.Argument(..., help="The private key file to write (OUT.pub beside it)."),
    comment: str = typer.Option("", "--comment", help="A note on the public key's line."),
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON."),
) -> None:
    """Make an Ed25519 key pair: keep OUT private (mode 0600), hand out OUT.pub."""
    try:
        private, public = generate_keypair(out, comment=comment)
        key_id = next(iter(trusted_keys(str(public))))
    except SignatureError as e:
        fail(str(e))
    info = {"private key": str(private), "public key": str(public), "key id": key_id}
    if as_json:
        emit({"private_key": str(private), "public_key": str(public), "key_id": key_id})
        return
    emit_kv(info)
    typer.echo(f"sign with: export {SIGNING_KEY_ENV}={private} (judge tune signs its folder; "
               "store export signs its checkpoint)")  # fmt: skip
    typer.echo(f"verify with: export {TRUSTED_KEYS_ENV}={public}")


@keys_app.command("sign")
def keys_sign(
    folder: str = typer.Argument(..., help="A tuned model folder (`recjudge judge tune`)."),
    key: str = typer.Option(None, "--key", help=f"The private key (default ${SIGNING_KEY_ENV})."),
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON."),
) -> None:
    """Sign a tuned folder's card (which lists the sha256 of every file a loader reads).

    A checkpoint is signed when it is written: set $RECJUDGE_SIGNING_KEY and run `store
    export` (or `store reseal` for one written before)."""
    from recjudge.llm import SIGNATURE_FILE, TunedCardError, sign_card

    if not (key or os.environ.get(SIGNING_KEY_ENV)):
        fail(f"no key: pass --key KEY or set ${SIGNING_KEY_ENV} (make one with `recjudge "
             "keys generate KEY`)")  # fmt: skip
    try:
        signature = sign_card(folder, key)
    except (TunedCardError, SignatureError) as e:
        fail(str(e))
    assert signature is not None  # a key is named
    out = {"signed": folder, "key_id": signature["key_id"],
           "signature_file": str(Path(folder) / SIGNATURE_FILE)}  # fmt: skip
    if as_json:
        emit(out)
    else:
        emit_kv({"signed": folder, "key id": signature["key_id"],
                 "written": out["signature_file"]})  # fmt: skip


@keys_app.command("verify")
def keys_verify(
    path: str = typer.Argument(..., help="A model folder or a checkpoint file."),
    key: list[str] = typer.Option(
        None, "--key", help=f"A trusted public key (repeatable; default ${TRUSTED_KEYS_ENV})."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON."),
) -> None:
    """Check a folder or checkpoint as loading or importing it would, against trusted keys.

    Exit 0 when a trusted key signed it and every file matches; exit 2 with the reason
    otherwise."""
    from recjudge.llm import TunedCardError, verify_folder
    from recjudge.reward import PortableError, verify_portable

    spec = os.pathsep.join(key) if key else os.environ.get(TRUSTED_KEYS_ENV, "")
    if not spec:
        fail(f"no trusted key: pass --key KEY.pub or set ${TRUSTED_KEYS_ENV}")
    before = os.environ.get(TRUSTED_KEYS_ENV)
    os.environ[TRUSTED_KEYS_ENV] = spec
    try:
        trusted_keys()  # a bad key file: its own message, before the path's
        if Path(path).is_dir():
            signer, what = verify_folder(path), "model folder"
        else:
            signer, what = verify_portable(path)[1], "checkpoint"
    except (TunedCardError, PortableError, SignatureError) as e:
        fail(str(e))
    finally:
        if before is None:
            os.environ.pop(TRUSTED_KEYS_ENV, None)
        else:
            os.environ[TRUSTED_KEYS_ENV] = before
    out = {"path": path, "kind": what, "verified": True, "key_id": signer}
    if as_json:
        emit(out)
    else:
        emit_kv({"verified": f"{what} {path}", "signed by key": signer})
