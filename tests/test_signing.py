"""Ed25519 signatures of model folders and checkpoints (issue 110, item 5): anyone with the
public key verifies them; a folder or checkpoint no trusted key signed is refused by name
unless the user says --trust-unsigned."""

from __future__ import annotations

import base64
import gzip
import json
import shutil
from collections import Counter
from pathlib import Path

import pytest

from cli_in_process import run_cli
from recjudge._signing import (
    SIGNING_KEY_ENV,
    TRUST_UNSIGNED_ENV,
    TRUSTED_KEYS_ENV,
    SignatureError,
    generate_keypair,
    parse_public,
    sign,
    trusted_keys,
    verify,
)
from recjudge._util import sha256_file
from recjudge.llm import (
    SIGNATURE_FILE,
    TUNED_CARD,
    LLMConfig,
    ModelLoadError,
    card_digest,
    llm_key,
    resolve_model_path,
    sign_card,
)
from recjudge.reward import PortableError, import_portable, reseal_portable, verify_portable
from recjudge.reward._portable import _write as write_checkpoint

CHECKPOINT = Path(__file__).parents[1] / "checkpoints" / "arena-both-ml1m-1.5b" / "store.ckpt.gz"


@pytest.fixture()
def keys(tmp_path):
    """Two key pairs: the team's (trusted) and a stranger's."""
    team = generate_keypair(tmp_path / "keys" / "team", comment="team")
    other = generate_keypair(tmp_path / "keys" / "other")
    return team, other


def test_a_signature_verifies_with_its_key_and_nothing_else(keys):
    (team, team_pub), (other, other_pub) = keys
    assert team.stat().st_mode & 0o077 == 0  # the private key is the owner's alone
    assert team_pub.read_text().startswith("recjudge-ed25519 ")
    trusted = trusted_keys(str(team_pub))
    sig = sign("sha256:" + "ab" * 32, "recjudge-tuned-card", team)
    assert verify("sha256:" + "ab" * 32, "recjudge-tuned-card", sig, trusted).key_id == (
        next(iter(trusted))
    )
    cases = {
        "other content": (sign("sha256:" + "cd" * 32, "recjudge-tuned-card", team), trusted),
        # a card's signature is not a checkpoint's, though both sign a sha256
        "other content ": (sign("sha256:" + "ab" * 32, "recjudge-checkpoint", team), trusted),
        "does not list": (sign("sha256:" + "ab" * 32, "recjudge-tuned-card", other), trusted),
        "no Ed25519": (None, trusted),
    }
    for words, (s, k) in cases.items():
        with pytest.raises(SignatureError, match=words.strip()):
            verify("sha256:" + "ab" * 32, "recjudge-tuned-card", s, k)
    forged = dict(sig)
    raw = bytearray(base64.b64decode(sig["signature"]))
    raw[0] ^= 1
    forged["signature"] = base64.b64encode(bytes(raw)).decode()
    with pytest.raises(SignatureError, match="does not verify"):
        verify("sha256:" + "ab" * 32, "recjudge-tuned-card", forged, trusted)
    # both keys trusted through a folder of .pub files
    assert len(trusted_keys(str(team_pub.parent))) == 2


def test_key_files_that_are_not_keys_are_named(tmp_path, keys):
    (team, team_pub), _ = keys
    for text, words in [("ssh-ed25519 AAAA", "not a recjudge public key"),
                        ("recjudge-ed25519 !!!", "not 32 bytes")]:  # fmt: skip
        with pytest.raises(SignatureError, match=words):
            parse_public(text, "k.pub")
    with pytest.raises(SignatureError, match="does not exist"):
        trusted_keys(str(tmp_path / "missing.pub"))
    with pytest.raises(SignatureError, match="not an unencrypted PEM private key"):
        sign("d", "p", team_pub)  # the public file given as the private key
    with pytest.raises(SignatureError, match="exists; a key is never overwritten"):
        generate_keypair(team)


def _folder(tiny_dir, where: Path) -> Path:
    """A tuned-shaped folder: the tiny model and a card listing every file (as `judge tune`
    writes it; its loop is tested in tests/tune/test_tune.py)."""
    shutil.copytree(tiny_dir, where)
    (where / "tuning-users.json").write_text('{"format": "recjudge-tuning-users"}')
    files = sorted(p.name for p in where.iterdir() if p.is_file())
    card = {"format": "recjudge-tuned", "base_model": "tiny-llama",
            "weights_sha256": {"model.safetensors": sha256_file(where / "model.safetensors")},
            "files_sha256": {f: sha256_file(where / f) for f in files}}  # fmt: skip
    (where / TUNED_CARD).write_text(json.dumps(card))
    return where


def _rewrite_card(folder: Path) -> None:
    """What an attacker who can write the folder does: change a weight, then the card's
    digests to match."""
    w = folder / "model.safetensors"
    data = bytearray(w.read_bytes())
    data[-1] ^= 1
    w.write_bytes(bytes(data))
    card = json.loads((folder / TUNED_CARD).read_text())
    card["weights_sha256"]["model.safetensors"] = sha256_file(w)
    card["files_sha256"]["model.safetensors"] = sha256_file(w)
    (folder / TUNED_CARD).write_text(json.dumps(card))


def test_a_trusted_key_refuses_every_swapped_folder_by_name(tiny_dir, tmp_path, keys,
                                                            monkeypatch):  # fmt: skip
    (team, team_pub), (other, _) = keys
    signed = _folder(tiny_dir, tmp_path / "signed")
    assert sign_card(signed, team)["key_id"]
    assert (signed / SIGNATURE_FILE).is_file()
    # without trusted keys the card's digests are checked as before: a rewritten card passes
    rewritten = tmp_path / "rewritten"
    shutil.copytree(signed, rewritten)
    _rewrite_card(rewritten)
    assert resolve_model_path(str(rewritten)) == rewritten

    monkeypatch.setenv(TRUSTED_KEYS_ENV, str(team_pub))
    assert resolve_model_path(str(signed)) == signed
    unsigned = tmp_path / "unsigned"
    shutil.copytree(signed, unsigned)
    (unsigned / SIGNATURE_FILE).unlink()
    by_other = tmp_path / "by-other"
    shutil.copytree(signed, by_other)
    sign_card(by_other, other)
    plain = tmp_path / "plain"
    shutil.copytree(tiny_dir, plain)
    copied_sig = _folder(tiny_dir, tmp_path / "copied-sig")  # another card, the signature copied
    shutil.copy2(signed / SIGNATURE_FILE, copied_sig / SIGNATURE_FILE)
    (copied_sig / TUNED_CARD).write_text((copied_sig / TUNED_CARD).read_text() + " ")
    cases = {
        rewritten: "rewritten: its card carries a signature of other content",
        unsigned: "unsigned: its card carries no Ed25519 signature",
        by_other: "by-other: its card is signed by key",
        plain: "plain: no signed card",
        copied_sig: "copied-sig: its card carries a signature of other content",
    }
    for folder, words in cases.items():
        with pytest.raises(ModelLoadError, match=words) as e:
            resolve_model_path(str(folder))
        assert "--trust-unsigned" in str(e.value)

    # --trust-unsigned: loaded with a warning, keyed by its files, never by the card it fails
    monkeypatch.setenv(TRUST_UNSIGNED_ENV, "1")
    with pytest.warns(UserWarning, match="--trust-unsigned: loading it anyway"):
        assert resolve_model_path(str(rewritten)) == rewritten
    key = llm_key(LLMConfig(model=str(rewritten)))["tuned"]
    assert key.startswith("unverified-")
    assert llm_key(LLMConfig(model=str(signed)))["tuned"] == card_digest(signed)[:16]


def test_tune_signs_its_folder_when_a_key_is_named(tiny_dir, tmp_path, keys, monkeypatch):
    """`sign_card` is what `judge tune` calls after writing the card; a card that does not
    match its folder is never signed."""
    (team, team_pub), _ = keys
    folder = _folder(tiny_dir, tmp_path / "t")
    assert sign_card(folder) is None and not (folder / SIGNATURE_FILE).exists()  # no key named
    monkeypatch.setenv(SIGNING_KEY_ENV, str(team))
    _rewrite_card(folder)  # a consistent card: signable
    (folder / "config.json").write_text("{}")  # ... until a file it lists changes
    with pytest.raises(Exception, match="config.json is not the file its card"):
        sign_card(folder)
    assert not (folder / SIGNATURE_FILE).exists()


def test_keys_commands_sign_and_verify_a_folder(tiny_dir, tmp_path):
    r = run_cli("keys", "generate", str(tmp_path / "k"), "--json")
    assert r.code == 0, r.stderr
    got = json.loads(r.stdout)
    folder = _folder(tiny_dir, tmp_path / "t")
    r = run_cli("keys", "verify", str(folder), "--key", got["public_key"])
    assert r.code == 2 and "no Ed25519 signature" in r.stderr  # not signed yet
    r = run_cli("keys", "sign", str(folder), "--key", got["private_key"], "--json")
    assert r.code == 0, r.stderr
    assert json.loads(r.stdout)["key_id"] == got["key_id"]
    r = run_cli("keys", "verify", str(folder), "--key", got["public_key"], "--json")
    assert r.code == 0, r.stderr
    assert json.loads(r.stdout)["key_id"] == got["key_id"]
    r = run_cli("keys", "verify", str(folder))
    assert r.code == 2 and "no trusted key" in r.stderr


def test_a_checkpoint_signed_on_export_is_refused_when_changed_or_unsigned(
    tmp_path, keys, monkeypatch
):
    (team, team_pub), (other, _) = keys
    monkeypatch.setenv(SIGNING_KEY_ENV, str(team))
    signed = tmp_path / "signed.gz"
    reseal_portable(CHECKPOINT, signed)
    monkeypatch.delenv(SIGNING_KEY_ENV)
    monkeypatch.setenv(TRUSTED_KEYS_ENV, str(team_pub))
    count, signer = verify_portable(signed)
    assert count.verified == "signed" and signer == next(iter(trusted_keys()))
    assert import_portable(signed, tmp_path / "s.sqlite").verified == "signed"

    # one row dropped and the manifest re-digested by someone without the key: the file is
    # consistent, and no trusted key signed it
    lines = gzip.decompress(signed.read_bytes()).decode().splitlines()[1:-1]
    tables = Counter(json.loads(line)["table"] for line in lines)
    forged = tmp_path / "forged.gz"
    write_checkpoint(forged, lines, {t: tables[t] for t in ("results", "decisions", "personas")}
                     | {"left_out": 0}, "s")  # fmt: skip
    monkeypatch.setenv(SIGNING_KEY_ENV, str(other))
    by_other = tmp_path / "other.gz"
    reseal_portable(CHECKPOINT, by_other, trust_unsigned=True)  # (the source is unsigned)
    monkeypatch.delenv(SIGNING_KEY_ENV)
    for path, words in [(CHECKPOINT, "no Ed25519 signature"), (forged, "no Ed25519 signature"),
                        (by_other, "does not list")]:  # fmt: skip
        with pytest.raises(PortableError, match=words):
            import_portable(path, tmp_path / "x.sqlite")
    assert not (tmp_path / "x.sqlite").exists()
    assert import_portable(CHECKPOINT, tmp_path / "x.sqlite",
                           trust_unsigned=True).verified == "unverified"  # fmt: skip
