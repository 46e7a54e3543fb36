"""Ed25519 signatures that anyone with the public key verifies (issue 110).

A tuned model folder (its card lists the sha256 of every file a loader reads) and a store
checkpoint (its manifest digest covers every row) are vouched for by one signature over
their digest. The signer keeps a private key (``recjudge keys generate``) and names it in
``$RECJUDGE_SIGNING_KEY`` (a file path: the key itself never sits in the environment, is
never printed and never reaches a Ray worker); readers list the public keys they trust in
``$RECJUDGE_TRUSTED_KEYS`` (files or folders of ``*.pub``, separated by ``os.pathsep``).
With trusted keys set, a folder or checkpoint that no trusted key signed is refused unless
the user says ``--trust-unsigned``.

A public key file is one line, ``recjudge-ed25519 <base64 of the 32 raw bytes> [comment]``,
the shape of an OpenSSH or minisign public key; a signature is a JSON object::

    {"algorithm": "ed25519", "key_id": "<16 hex>", "signed": "<what>:<digest>",
     "signature": "<base64 of 64 bytes>"}

where ``signed`` is the message (a purpose prefix and the digest: a card's signature cannot
be replayed as a checkpoint's) and ``key_id`` the first 16 hex digits of the sha256 of the
raw public key. The primitives are ``cryptography``'s (OpenSSL's Ed25519, RFC 8032).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization as ser
from cryptography.hazmat.primitives.asymmetric import ed25519

from recjudge._util import UserFacingError, atomic_write_bytes

SIGNING_KEY_ENV = "RECJUDGE_SIGNING_KEY"
TRUSTED_KEYS_ENV = "RECJUDGE_TRUSTED_KEYS"
#: set by the root ``--trust-unsigned`` option: a tuned folder without a card, or one that
#: does not match it, or one no trusted key signed, is loaded with a warning
TRUST_UNSIGNED_ENV = "RECJUDGE_TRUST_UNSIGNED"
ALGORITHM = "ed25519"
PUBLIC_PREFIX = "recjudge-ed25519"
#: the longest key file read (a PEM private key is ~120 bytes, a public line ~100)
_MAX_KEY_FILE = 16_384


class SignatureError(UserFacingError, ValueError):
    """A key file that is not one, or a signature that does not verify."""


@dataclass(frozen=True)
class Verified:
    """Who vouched for a digest.

    Attributes:
        key_id: the trusted public key's id (16 hex digits).
        source: the file that key was read from, by its name (no folder: no machine path).
    """

    key_id: str
    source: str


def key_id(raw_public: bytes) -> str:
    """The id of a raw 32-byte public key: sha256, 16 hex digits."""
    return hashlib.sha256(raw_public).hexdigest()[:16]


def _raw_public(private: Any) -> bytes:
    return private.public_key().public_bytes(ser.Encoding.Raw, ser.PublicFormat.Raw)


def generate_keypair(out: str | Path, *, comment: str = "") -> tuple[Path, Path]:
    """A new Ed25519 key pair: ``OUT`` (the private key, PKCS#8 PEM, mode 0600) and
    ``OUT.pub`` (the public line to hand to readers). Refuses to overwrite either.

    Returns:
        The private and public key paths.
    """
    out = Path(out)
    pub = out.with_name(out.name + ".pub")
    for p in (out, pub):
        if p.exists():
            raise SignatureError(f"{p}: exists; a key is never overwritten (choose another "
                                 "name, or remove the old pair if nothing it signed "
                                 "matters)")  # fmt: skip
    private = ed25519.Ed25519PrivateKey.generate()
    pem = private.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.NoEncryption())
    out.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # never readable by others
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    raw = _raw_public(private)
    line = f"{PUBLIC_PREFIX} {base64.b64encode(raw).decode()}"
    safe = " ".join(comment.split())[:80]
    atomic_write_bytes(pub, (line + (f" {safe}" if safe else "") + "\n").encode())
    pub.chmod(0o644)  # a public key is for handing out
    return out, pub


def _read_key_file(path: Path, what: str) -> bytes:
    try:
        if path.stat().st_size > _MAX_KEY_FILE:
            raise SignatureError(f"{path}: {what} of {path.stat().st_size} bytes is no key "
                                 "file")  # fmt: skip
        return path.read_bytes()
    except OSError as e:
        env = SIGNING_KEY_ENV if "private" in what else TRUSTED_KEYS_ENV
        raise SignatureError(f"{path}: cannot read {what} ({e.strerror}); check the path "
                             f"in ${env}") from None  # fmt: skip


def load_private(path: str | Path) -> Any:
    """An Ed25519 private key from a PEM file (``recjudge keys generate``)."""
    path = Path(path).expanduser()
    data = _read_key_file(path, "the private key")
    try:
        key = ser.load_pem_private_key(data, password=None)
    except (ValueError, TypeError):
        raise SignatureError(f"{path}: not an unencrypted PEM private key; make one with "
                             "`recjudge keys generate`") from None  # fmt: skip
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise SignatureError(f"{path}: not an Ed25519 key; make one with `recjudge keys "
                             "generate`")  # fmt: skip
    return key


def parse_public(text: str, source: str = "public key") -> tuple[str, Any]:
    """``(key_id, key)`` of a ``recjudge-ed25519 <base64>`` line."""
    parts = text.strip().split()
    if len(parts) < 2 or parts[0] != PUBLIC_PREFIX:
        raise SignatureError(f"{source}: not a recjudge public key (a line '{PUBLIC_PREFIX} "
                             "<base64>', as `recjudge keys generate` writes to "
                             "KEY.pub)")  # fmt: skip
    try:
        raw = base64.b64decode(parts[1], validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != 32:
        raise SignatureError(f"{source}: the key is not 32 bytes of base64; copy the .pub "
                             "file whole")  # fmt: skip
    return key_id(raw), ed25519.Ed25519PublicKey.from_public_bytes(raw)


def _key_files(entry: Path) -> list[Path]:
    if entry.is_dir():
        return sorted(entry.glob("*.pub"))
    return [entry]


def trusted_keys(spec: str | None = None) -> dict[str, tuple[Any, str]]:
    """The public keys ``$RECJUDGE_TRUSTED_KEYS`` (or ``spec``) names: key id -> (key, the
    file's name). Empty when unset: nothing is required to be signed."""
    spec = os.environ.get(TRUSTED_KEYS_ENV, "") if spec is None else spec
    out: dict[str, tuple[Any, str]] = {}
    for part in filter(None, (p.strip() for p in spec.split(os.pathsep))):
        entry = Path(part).expanduser()
        if not entry.exists():
            raise SignatureError(f"${TRUSTED_KEYS_ENV}: {part} does not exist; list public "
                                 "key files or folders of *.pub, separated by "
                                 f"'{os.pathsep}'")  # fmt: skip
        for f in _key_files(entry):
            text = _read_key_file(f, "a public key").decode("utf-8", "replace")
            kid, key = parse_public(text, str(f))
            out[kid] = (key, f.name)
    return out


def sign(digest: str, purpose: str, key_path: str | Path | None = None) -> dict[str, str] | None:
    """A signature of ``purpose:digest`` with ``key_path`` (default ``$RECJUDGE_SIGNING_KEY``);
    None when no key is named."""
    key_path = key_path or os.environ.get(SIGNING_KEY_ENV)
    if not key_path:
        return None
    private = load_private(key_path)
    message = f"{purpose}:{digest}"
    return {
        "algorithm": ALGORITHM,
        "key_id": key_id(_raw_public(private)),
        "signed": message,
        "signature": base64.b64encode(private.sign(message.encode("utf-8"))).decode(),
    }


def verify(digest: str, purpose: str, signature: Any, keys: dict[str, tuple[Any, str]]) -> Verified:
    """Check ``signature`` (``sign``'s object) over ``purpose:digest`` against ``keys``.

    Raises:
        SignatureError: no signature, another message, a key no one trusts, or a signature
            that does not verify (each says which).
    """
    if not isinstance(signature, dict) or signature.get("algorithm") != ALGORITHM:
        raise SignatureError("carries no Ed25519 signature")
    message = f"{purpose}:{digest}"
    if signature.get("signed") != message:
        raise SignatureError("carries a signature of other content (it was changed after "
                             "signing, or the signature was copied from another file)")  # fmt: skip
    kid = str(signature.get("key_id"))
    if kid not in keys:
        raise SignatureError(f"is signed by key {kid[:16]!r}, which ${TRUSTED_KEYS_ENV} does "
                             "not list")  # fmt: skip
    key, source = keys[kid]
    try:
        key.verify(base64.b64decode(str(signature.get("signature")), validate=True),
                   message.encode("utf-8"))  # fmt: skip
    except (InvalidSignature, binascii.Error, ValueError):
        raise SignatureError(f"carries a signature that key {kid} does not verify") from None
    return Verified(kid, source)


def trust_unsigned() -> bool:
    """Whether the user said ``--trust-unsigned`` (``$RECJUDGE_TRUST_UNSIGNED``)."""
    return os.environ.get(TRUST_UNSIGNED_ENV, "").strip().lower() in ("1", "true", "yes")


__all__ = [
    "ALGORITHM",
    "SIGNING_KEY_ENV",
    "TRUSTED_KEYS_ENV",
    "TRUST_UNSIGNED_ENV",
    "SignatureError",
    "Verified",
    "generate_keypair",
    "key_id",
    "load_private",
    "parse_public",
    "sign",
    "trust_unsigned",
    "trusted_keys",
    "verify",
]
