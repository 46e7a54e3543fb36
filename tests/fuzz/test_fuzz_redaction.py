"""Fuzz: the one redaction of addresses (``_util.redact_uri``, issue 111). Whatever a password,
a token or a query value holds (``@``, ``:``, ``/``, ``?``, ``#``, ``%``, unicode), a message
that quotes the address prints none of it, in a URI with a scheme or a schemeless Ray
address, at the start, middle or end of a sentence."""

from __future__ import annotations

import string

from _fuzz import FUZZ
from hypothesis import assume, given
from hypothesis import strategies as st

from recjudge._util import redact_uri

#: what can stand inside one whitespace-free address token (quotes and brackets end it)
ADDRESS_CHARS = "".join(c for c in string.printable if c not in string.whitespace + "'\"<>")
secrets = st.text(alphabet=ADDRESS_CHARS + "éü€", min_size=6, max_size=24).filter(
    lambda s: s.strip(".,;:)]") == s  # sentence punctuation at its end is not part of it
)
hosts = st.sampled_from(["127.0.0.1:1", "host:5000", "[::1]:8265", "db.example.org", "h:9"])
before = st.sampled_from(["", "error: cannot reach ", "uri=", "(", "--ray "])
after = st.sampled_from(["", " (connection refused)", ".", ", retrying", ")"])


@FUZZ
@given(secrets, hosts, before, after, st.sampled_from(["http://", "ray://", "postgresql://"]))
def test_a_password_is_never_printed(secret, host, pre, post, scheme):
    assume("@" not in host)
    text = f"{pre}{scheme}user:{secret}@{host}/x{post}"
    assert secret not in redact_uri(text)


@FUZZ
@given(secrets, hosts, before, after)
def test_a_schemeless_ray_password_is_never_printed(secret, host, pre, post):
    assume(":" in host and not host.startswith("["))
    text = f"{pre}user:{secret}@{host}{post}"
    assert secret not in redact_uri(text)


@FUZZ
@given(secrets, hosts, before, after, st.sampled_from(["token", "key", "sig", "x"]))
def test_a_query_value_and_a_fragment_are_never_printed(secret, host, pre, post, name):
    assume(not any(c in secret for c in "&#"))  # they would end the value in any parser
    for text in (f"{pre}https://{host}/p?{name}={secret}{post}",
                 f"{pre}https://{host}/p#{secret}{post}"):  # fmt: skip
        assert secret not in redact_uri(text)
