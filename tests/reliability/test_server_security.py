"""Server and client: no unauthenticated public bind, no printed key, no key in clear to
another host, no redirect followed with the key, and HTTP errors as one clear line."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading

import pytest

from recjudge._util import is_loopback, redact
from recjudge.decoding import EvidenceFirst
from recjudge.decoding._remote import bias_probe_due, engine_constrained
from recjudge.llm import LLMConfig
from recjudge.llm._vllm import OpenAICompatibleBackend, ServerError, check_key_transport

CLI = [sys.executable, "-m", "recjudge.cli._main"]


def run(*args, key=None):
    env = {k: v for k, v in os.environ.items() if k not in ("RECJUDGE_API_KEY", "VLLM_API_KEY")}
    if key:
        env["RECJUDGE_API_KEY"] = key
    return subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.parametrize(
    ("host", "loop"),
    [("127.0.0.1", True), ("127.8.0.1", True), ("::1", True), ("[::1]", True),
     ("localhost", True), ("0.0.0.0", False), ("10.0.0.5", False), ("example.org", False)],
)  # fmt: skip
def test_is_loopback(host, loop):
    assert is_loopback(host) is loop


def test_public_bind_without_key_is_refused():
    r = run("serve", "--dry-run", "--host", "0.0.0.0")
    assert r.returncode == 2 and "no API key is set" in r.stderr and "Traceback" not in r.stderr
    assert run("serve", "--dry-run", "--host", "0.0.0.0", "--allow-unauthenticated").returncode == 0
    assert run("serve", "--dry-run", "--host", "0.0.0.0", key="s3cret-key").returncode == 0


def test_dry_run_never_prints_the_key():
    r = run("serve", "--dry-run", key="s3cret-key")
    assert r.returncode == 0 and "s3cret-key" not in r.stdout + r.stderr
    assert "VLLM_API_KEY=***" in r.stdout


@pytest.mark.parametrize(
    ("url", "ok"),
    [("http://10.0.0.5:8000/v1", False), ("http://gpu-box:8000/v1", False),
     ("https://gpu-box/v1", True), ("http://127.0.0.1:8000/v1", True)],
)  # fmt: skip
def test_key_is_never_sent_in_clear_to_another_host(url, ok):
    if ok:
        check_key_transport(url, has_key=True)
    else:
        with pytest.raises(ValueError, match="plain http"):
            check_key_transport(url, has_key=True)
    check_key_transport(url, has_key=False)  # no key, nothing to leak


class _Loopback:
    """A loopback HTTP server in a daemon thread; ``respond(handler)`` answers each POST."""

    def __init__(self):
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                outer.respond(self)

            def log_message(self, *a):
                pass

        self.httpd = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def respond(self, handler):
        raise NotImplementedError

    def close(self):
        self.httpd.shutdown()


class _Server(_Loopback):
    """Answers every POST with ``status`` (and ``headers``), recording the Authorization
    header of every request it gets."""

    def __init__(self, status, headers=None):
        self.seen, self.status, self.headers = [], status, headers or {}
        super().__init__()

    def respond(self, h):
        self.seen.append(h.headers.get("Authorization"))
        h.send_response(self.status)
        for k, v in self.headers.items():
            h.send_header(k, v)
        h.end_headers()
        h.wfile.write(b'{"error": "nope"}')


@pytest.fixture
def client(monkeypatch):
    monkeypatch.setenv("RECJUDGE_API_KEY", "s3cret-key")

    def make(url):
        return OpenAICompatibleBackend(
            LLMConfig(model="smollm2-135m", backend="openai-compatible", base_url=url)
        )

    return make


def test_401_is_one_clear_line(client):
    srv = _Server(401)
    try:
        with pytest.raises(ServerError, match=r"refused the request \(401\).*RECJUDGE_API_KEY"):
            client(srv.url)._post("/completions", {})
    finally:
        srv.close()


def test_redirect_is_not_followed_with_the_key(client):
    elsewhere = _Server(200)
    srv = _Server(307, {"Location": elsewhere.url + "/completions"})
    try:
        with pytest.raises(ServerError, match=r"redirects \(307\).*not followed"):
            client(srv.url)._post("/completions", {})
        assert srv.seen == ["Bearer s3cret-key"] and elsewhere.seen == []
    finally:
        srv.close()
        elsewhere.close()


def test_cli_against_a_server_that_refuses_the_key():
    srv = _Server(401)
    try:
        r = run("judge", "--data", "ml-100k", "--user", "1", "--candidate", "1", "--mode",
                "no-behavior", "--server", srv.url, key="k3y-0f-the-client")  # fmt: skip
    finally:
        srv.close()
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "refused the request (401)" in r.stderr and "k3y-0f-the-client" not in r.stderr


class _CompletionServer(_Loopback):
    """A stand-in for a vLLM server's /completions: it answers with the token ids of
    ``answer(payload)`` (the recjudge bias payload it was sent, or None)."""

    def __init__(self, tokenizer, answer):
        self.tokenizer, self.answer = tokenizer, answer
        super().__init__()

    def respond(self, h):
        body = json.loads(h.rfile.read(int(h.headers["Content-Length"])))
        raw = (body.get("vllm_xargs") or {}).get("recjudge")
        text = self.answer(json.loads(raw) if raw else None)
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        # flat log-probabilities over the watched tokens at every step
        step = {f"token_id:{t}": -1.0 for t in body.get("logprob_token_ids") or []}
        out = {"choices": [{"text": text, "token_ids": ids,
                            "logprobs": {"top_logprobs": [step] * len(ids)}}]}  # fmt: skip
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.end_headers()
        h.wfile.write(json.dumps(out).encode())


YES = '{"evidence": ["Heat (1995)"], "is_relevant": "YES"}'
NO = '{"evidence": [], "is_relevant": "NO"}'


@pytest.mark.parametrize(
    ("answer", "ok"),
    [(lambda p: YES if p and p["signal"] > 0 else NO, True),  # applies the bias
     (lambda p: NO, False),  # a plain server: the same answer whatever the bias
     (lambda p: YES, False)],
)  # fmt: skip
def test_a_server_without_the_bias_processor_is_refused(answer, ok):
    backend = OpenAICompatibleBackend(
        LLMConfig(
            model="smollm2-135m", backend="openai-compatible", base_url="http://127.0.0.1:1/v1"
        )
    )
    srv = _CompletionServer(backend.tokenizer, answer)
    backend.url = srv.url
    prompt = backend.encode("any prompt")
    try:
        if ok:
            out = engine_constrained(backend, [prompt], [EvidenceFirst(["Heat (1995)"])], [1.0],
                                     None)  # fmt: skip
            assert out[0].value["is_relevant"] == "YES" and not bias_probe_due(backend)
            assert backend.needs_bias_probe  # what the backend declares is left as it was
        else:
            with pytest.raises(ServerError, match="does not apply recjudge's bias processor"):
                engine_constrained(backend, [prompt], [EvidenceFirst(["Heat (1995)"])], [1.0],
                                   None)  # fmt: skip
            assert bias_probe_due(backend)  # asked again next time, never assumed
    finally:
        srv.close()


class _Echo(_Loopback):
    """A hostile server: answers ``status`` with the request's Authorization header in the
    body (as some proxies' error pages do)."""

    def __init__(self, status, body=None):
        self.status, self.body = status, body
        super().__init__()

    def respond(self, h):
        h.send_response(self.status)
        h.end_headers()
        h.wfile.write(
            self.body or f"bad request, you sent {h.headers.get('Authorization')}".encode()
        )


@pytest.mark.parametrize("status", [400, 500, 200])
def test_an_error_line_never_prints_the_api_key(client, status):
    # 400/500: the body is quoted in the error line; 200 with a body that is not a
    # completion: refused as not a vLLM server. Either way the key is not in the line.
    srv = _Echo(status)
    try:
        with pytest.raises(ServerError) as e:
            client(srv.url)._post("/completions", {})
        assert "s3cret-key" not in str(e.value)
        if status != 200:
            assert "[redacted]" in str(e.value)
    finally:
        srv.close()


def test_json_that_is_not_a_completion_is_a_server_error(client):
    srv = _Echo(200, b'{"choices": []}')
    try:
        with pytest.raises(ServerError, match="without a completion"):
            client(srv.url)._post("/completions", {})
    finally:
        srv.close()


def test_redact_by_hand():
    assert redact("key=abcd1234 again abcd1234", "abcd1234") == "key=[redacted] again [redacted]"
    assert redact("a b c", "") == "a b c" and redact("yes no", "no") == "yes no"
