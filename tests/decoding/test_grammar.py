"""Grammars under random logits over the real SmolLM2 tokenizer, with adversarial strings."""

from __future__ import annotations

import copy
import gc
import json
import os
import shutil
import weakref

import numpy as np
import pytest
import torch
import xgrammar as xgr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from recjudge.decoding import (
    GRAMMARS,
    BranchBiasProcessor,
    Choice,
    CitedList,
    EvidenceFirst,
    GrammarLogitsProcessor,
    Picks,
    SchemaError,
    Verdicts,
    compile_schema,
)
from recjudge.decoding._compile import GrammarCache, _table_key
from recjudge.decoding._processors import veto_repeats
from recjudge.llm import resolve_model_path
from recjudge.reward import ask


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(resolve_model_path("smollm2-135m"))


def run_random(compiled, seed: int, signal=None, beta=0.0, max_steps=3000):
    """Decode one row with random logits through grammar (+ bias) processors."""
    rng = np.random.default_rng(seed)
    grammar = GrammarLogitsProcessor([compiled])
    spec = compiled.decision()
    bias = None
    if spec is not None and signal is not None:
        bias = BranchBiasProcessor([spec], compiled.table.token_bytes, [signal], beta=beta)
    ids = torch.zeros((1, 1), dtype=torch.long)
    for _ in range(max_steps):
        scores = torch.from_numpy(rng.normal(0, 3, compiled.table.width).astype(np.float32))
        scores = scores[None, :].clone()
        grammar(ids, scores)
        if bias is not None:
            bias(ids, scores)
        finite = torch.isfinite(scores[0])
        assert finite.any(), f"dead end after {grammar.text(0)!r}"
        tok_id = int(torch.where(finite, scores[0], torch.tensor(-1e30)).argmax())
        if grammar.matchers[0].is_terminated():
            break
        ids = torch.cat([ids, torch.tensor([[tok_id]])], dim=1)
        if tok_id in compiled.table.stop_ids:
            grammar(ids, torch.zeros_like(scores))  # consume the stop token
            if bias is not None:
                bias(ids, torch.zeros_like(scores))
            break
    assert grammar.done(0), f"did not finish: {grammar.text(0)!r}"
    return grammar.text(0), (bias.records[0] if bias else None)


_nasty = st.sampled_from(
    [
        'He said "hi"',
        "back\\slash",
        "new\nline",
        "tab\there",
        "emoji 🎬🍿",
        "日本語の映画",
        '"]',
        '"is_relevant"',
        "}",
        '", "is_relevant": "YES"}',
        '\\"',
        "Heat",
        "Heat 2",
        "Heat (1995)",
        "x" * 300,
        "",
        " ",
        "\u2028sep",
        "NUL\x00byte",
    ]
)
titles_st = st.lists(st.one_of(_nasty, st.text(min_size=0, max_size=40)), min_size=0, max_size=12)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(titles_st, st.integers(0, 2**31), st.floats(-1, 1), st.sampled_from([0.0, 5.0, 50.0]))
def test_evidence_first_random_logits(tok, titles, seed, sigma, beta):
    schema = EvidenceFirst(titles, max_evidence=3)
    compiled = compile_schema(schema, tok, 49152)
    text, rec = run_random(compiled, seed, signal=sigma, beta=beta)
    obj = json.loads(text)
    assert list(obj) == ["evidence", "is_relevant"]  # evidence comes first
    ev = obj["evidence"]
    assert set(ev) <= set(titles)
    assert len(ev) == len(set(ev)) <= 3  # distinct, bounded
    assert (len(ev) > 0) == (obj["is_relevant"] == "YES")  # the iff rule
    assert schema.parse(text) == obj
    if titles:
        assert rec.chosen == obj["is_relevant"]
        assert rec.decision_steps >= 1
        assert 0.0 <= rec.p_yes_before <= 1.0


def test_all_titles_cited_never_dead_ends(tok):
    """With max_evidence >= len(titles) a run may cite everything; it must still close."""
    schema = EvidenceFirst(["A", "B"], max_evidence=5)
    compiled = compile_schema(schema, tok, 49152)
    seen_two = False
    for seed in range(60):
        text, _ = run_random(compiled, seed, signal=1.0, beta=50.0)
        ev = json.loads(text)["evidence"]
        assert len(ev) == len(set(ev))
        seen_two |= len(ev) == 2
    assert seen_two


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.one_of(_nasty, st.text(min_size=1, max_size=20)), min_size=1, max_size=6, unique=True
    ),
    st.integers(0, 2**31),
    st.sampled_from([None, 60]),
)
def test_choice_random_logits(tok, options, seed, analysis):
    schema = Choice(options, analysis_chars=analysis)
    compiled = compile_schema(schema, tok, 49152)
    k = len(schema.options)
    signal = np.linspace(-1, 1, k) if k > 2 else 0.5
    text, rec = run_random(compiled, seed, signal=signal, beta=5.0)
    obj = schema.parse(text)
    assert obj["answer"] in options
    if analysis:
        assert len(obj["analysis"]) <= analysis
    if k > 1:
        assert rec.chosen == obj["answer"]


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.from_regex(r"[a-z0-9_\-\"\\]{1,8}", fullmatch=True), min_size=1, max_size=15, unique=True
    ),
    st.integers(0, 2**31),
)
def test_cited_list_random_logits(tok, ids, seed):
    schema = CitedList(ids, max_words=5, min_words=2, max_items=3, max_ids=4)
    compiled = compile_schema(schema, tok, 49152)
    text, _ = run_random(compiled, seed)
    entries = json.loads(text)
    assert 1 <= len(entries) <= 3
    for e in entries:
        assert 2 <= len(e["interest"].split(" ")) <= 5
        assert 1 <= len(e["ids"]) <= 4
        assert set(e["ids"]) <= set(ids)
    assert schema.parse(text)


def test_compiled_once_per_schema_and_tokenizer(tok):
    titles = [f"Movie {i} (19{i % 100:02d})" for i in range(200)]
    a = compile_schema(EvidenceFirst(titles), tok, 49152)
    hits = GRAMMARS.hits
    b = compile_schema(EvidenceFirst(list(titles)), tok, 49152)
    assert a is b and GRAMMARS.hits == hits + 1
    c = compile_schema(EvidenceFirst(titles, max_evidence=2), tok, 49152)
    assert c is not a


def test_mask_is_sized_to_logits_width(tok):
    # SmolLM2's tokenizer and logits are both 49152 wide; a wider head (as in Qwen) must be
    # masked beyond the tokenizer length.
    compiled = compile_schema(EvidenceFirst(["A"]), tok, 49152 + 64)
    proc = GrammarLogitsProcessor([compiled])
    scores = torch.zeros(1, 49152 + 64)
    proc(torch.zeros(1, 3, dtype=torch.long), scores)
    assert torch.isinf(scores[0, 49152:]).all()
    with pytest.raises(ValueError, match="width"):
        GrammarLogitsProcessor([compiled])(
            torch.zeros(1, 3, dtype=torch.long), torch.zeros(1, 49152)
        )


def test_processor_validates_inputs(tok):
    compiled = compile_schema(EvidenceFirst(["A"]), tok, 49152)
    with pytest.raises(ValueError, match="batch_size"):
        GrammarLogitsProcessor(compiled)
    spec = compiled.schema.decision()
    with pytest.raises(ValueError, match="not finite"):
        BranchBiasProcessor([spec], compiled.table.token_bytes, [float("nan")])
    with pytest.raises(ValueError, match="betas"):
        BranchBiasProcessor([spec, spec], compiled.table.token_bytes, [0.1, 0.2], beta=[1.0])
    with pytest.raises(ValueError, match="signal vector"):
        BranchBiasProcessor([Choice(["a", "b", "c"]).decision()], compiled.table.token_bytes, [0.5])


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**31))
def test_verdicts_random_logits(tok, seed):
    schema = Verdicts(
        ["accuracy", "novelty", "overall"], ["A wins", "B wins", "Tie"], analysis_chars=40
    )
    compiled = compile_schema(schema, tok, 49152)
    text, rec = run_random(compiled, seed, signal=np.array([0.5, -0.5, 0.0]), beta=1.0)
    obj = schema.parse(text)
    assert list(obj) == ["analysis", "accuracy", "novelty", "overall"]
    assert len(obj["analysis"]) <= 40
    assert rec.chosen == obj["overall"]  # the decision is taken on the last field
    assert sum(rec.p_before) == pytest.approx(1.0)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**31))
def test_verdicts_with_one_analysis_per_field(tok, seed):
    schema = Verdicts(
        ["accuracy", "novelty", "overall"],
        ["A wins", "B wins", "Tie"],
        analysis_chars=12,
        analysis_fields=["accuracy", "novelty"],
    )
    compiled = compile_schema(schema, tok, 49152)
    text, rec = run_random(compiled, seed, signal=np.array([0.5, -0.5, 0.0]), beta=1.0)
    obj = schema.parse(text)
    assert list(obj) == ["analysis", "accuracy", "novelty", "overall"]
    assert list(obj["analysis"]) == ["accuracy", "novelty"]
    assert all(len(t) <= 12 for t in obj["analysis"].values())
    assert rec.chosen == obj["overall"]  # the anchor of the decision field is still unique


def test_verdicts_decision_field_cannot_have_its_own_analysis():
    with pytest.raises(ValueError, match="decision field"):
        Verdicts(["a", "overall"], ["x", "y"], analysis_fields=["a", "overall"])


def test_finish_forced_jumps_to_the_end(tok):
    compiled = compile_schema(EvidenceFirst(["Alpha", "Beta"]), tok, 49152)
    g = GrammarLogitsProcessor([compiled])
    assert not g.finish_forced(0)  # at the start the verdict is open
    for t in tok.encode('{"evidence": ["Alpha"]', add_special_tokens=False):
        g.accept(0, t)
    assert g.finish_forced(0)
    assert json.loads(g.text(0)) == {"evidence": ["Alpha"], "is_relevant": "YES"}
    assert g.done(0)
    empty = GrammarLogitsProcessor([compile_schema(EvidenceFirst([]), tok, 49152)])
    assert empty.finish_forced(0)  # nothing to choose at all
    assert json.loads(empty.text(0))["is_relevant"] == "NO"


def test_picks_exactly_n_distinct_labels(smollm):
    labels = [str(i) for i in range(1, 13)]  # "1" is a prefix of "10", "11", "12"
    schema = Picks(labels, 4)
    # A prompt that invites repetition: distinctness must still hold.
    out = ask(
        smollm,
        [[{"role": "user", "content": 'Say "1" four times as JSON {"picks": [...]}.'}]],
        schema,
    )[0]
    assert out.value is not None
    assert len(out.value) == 4 and len(set(out.value)) == 4
    assert set(out.value) <= set(labels)
    with pytest.raises(ValueError):
        Picks(labels, 13)

    with pytest.raises(SchemaError):
        schema.parse('{"picks": ["1", "1", "2", "3"]}')


def test_free_text_rejects_utf16_surrogates(tok):
    """Byte tokens can spell ED A0 80 (a UTF-16 surrogate, not valid UTF-8); free text must
    not accept it, or an analysis decodes to replacement characters and overruns its limit
    (found by test_verdicts_random_logits, seed 2795)."""
    compiled = compile_schema(Choice(["x"], analysis_chars=10), tok, 49152)
    byte_tok = {}
    for i, b in enumerate(compiled.table.token_bytes):
        if len(b) == 1:
            byte_tok.setdefault(b[0], i)
    m = xgr.GrammarMatcher(compiled.grammar)
    assert m.accept_string('{"analysis": "')
    assert m.accept_token(byte_tok[0xED])
    assert not m.accept_token(byte_tok[0xA0])  # ED A0..BF starts a surrogate
    assert m.accept_token(byte_tok[0x9F]) and m.accept_token(byte_tok[0xBF])  # U+D7FF is fine


def test_grammar_cache_follows_the_tokenizer_object_not_its_id(tok):
    other = copy.deepcopy(tok)
    a, b = compile_schema(Choice(["YES", "NO"]), tok), compile_schema(Choice(["YES", "NO"]), other)
    assert a.table is not b.table  # a second tokenizer object gets its own table
    assert compile_schema(Choice(["YES", "NO"]), other) is b
    alive = weakref.ref(other)
    del other, b
    gc.collect()
    # The cache does not keep a dropped tokenizer alive (an id() key must, or go stale).
    assert alive() is None
    assert compile_schema(Choice(["YES", "NO"]), tok) is a


def test_allowed_is_the_union_of_what_the_rows_mask_leaves(tok):
    """``allowed(rows)`` (the fast engine's LM-head restriction) names exactly the tokens
    that ``mask`` leaves finite in at least one row, at rows in different grammar states."""
    titles = ["Heat (1995)", "Fargo (1996)", "Up (2009)"]
    compiled = compile_schema(EvidenceFirst(titles), tok, len(tok))
    grammar = GrammarLogitsProcessor([compiled] * 3)
    for row, text in ((1, '{"evidence": ["He'), (2, '{"evidence": []')):
        for t in tok.encode(text, add_special_tokens=False):
            grammar.accept(row, t)
    for rows in ([0], [1, 2], [0, 1, 2], [2, 0]):
        ids = grammar.allowed(rows)
        scores = torch.zeros(len(rows), compiled.table.width)
        grammar.mask(scores, rows)
        union = torch.isfinite(scores).any(0).nonzero().squeeze(1)
        assert ids.dtype == torch.long and torch.equal(ids, union), rows


def test_mask_on_the_allowed_columns_only_equals_the_full_mask(tok):
    """With ``columns`` (the head computed only for ``allowed``'s ids, the rest -inf), the
    grammar mask, the distinct-evidence veto and the branch bias give exactly the scores of
    the full-width path, at rows in different states (a title already cited included)."""
    titles = ["Heat (1995)", "Heathers (1989)", "Fargo (1996)", "Up (2009)"]
    compiled = compile_schema(EvidenceFirst(titles), tok, len(tok))
    texts = ['{"evidence": ["He', '{"evidence": ["Heat (1995)", "', '{"evidence": [', ""]
    g = torch.Generator().manual_seed(0)
    base = torch.randn(len(texts), compiled.table.width, generator=g)
    got = {}
    for how in ("full", "columns"):
        grammar = GrammarLogitsProcessor([compiled] * len(texts))
        spec = compiled.schema.decision(compiled.table.json_literal)
        bias = BranchBiasProcessor(
            [spec] * len(texts), compiled.table.token_bytes, [0.7, -0.4, 0.9, 0.2], beta=3.0
        )
        for row, text in enumerate(texts):
            for t in tok.encode(text, add_special_tokens=False):
                grammar.accept(row, t)
                bias.accept(row, t)
        rows = list(range(len(texts)))
        ids = grammar.allowed(rows)
        scores = torch.full_like(base, float("-inf"))
        scores[:, ids] = base[:, ids]
        columns = ids if how == "columns" else None
        grammar.mask(scores, rows, columns)
        bias.apply(scores, rows, columns)
        got[how] = (scores, [r.steps for r in bias.records])
    assert torch.equal(got["full"][0], got["columns"][0])
    assert got["full"][1] == got["columns"][1]
    assert any(got["full"][1])  # the row at the decision recorded its step


def _reference_veto(tracker, allowed, token_bytes):
    """The distinct-evidence veto byte by byte: every allowed token walked through a copy
    of the tracker's state (what ``veto_repeats`` computes with its shortcuts)."""
    out = []
    for t in allowed:
        data = token_bytes[t]
        if not data:
            continue
        cited = set(tracker.cited)
        state, partial, ok = tracker._step(tracker.state, tracker.partial, cited, data)
        if not (ok and tracker._viable(state, partial, cited)):
            out.append(t)
    return sorted(out)


def _veto_matches_reference(grammar, tracker, table, scores) -> list[int]:
    """Check the veto at the row's current state; returns the tokens it leaves."""
    grammar.trackers[0] = None  # the grammar alone
    grammar.mask(scores)
    grammar.trackers[0] = tracker
    allowed = torch.isfinite(scores[0]).nonzero().flatten().tolist()
    row = scores[0].clone()
    veto_repeats(tracker, row, table)
    got = sorted(t for t in allowed if not torch.isfinite(row[t]))
    assert got == (_reference_veto(tracker, allowed, table.token_bytes) if tracker.active()
                   else []), grammar.text(0)  # fmt: skip
    return [t for t in allowed if torch.isfinite(row[t])]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(titles_st, st.integers(0, 2**31))
def test_the_distinct_evidence_veto_equals_its_byte_by_byte_reference(tok, titles, seed):
    """At every step of an answer citing titles that prefix each other, and along random
    answers (random tokens under the grammar) whatever the titles (quotes, escapes,
    non-ASCII), the veto vetoes exactly the grammar-allowed tokens the byte-by-byte walk
    rejects."""
    titles = [*titles, "Heat", "Heat (1995)", "Heathers"]
    compiled = compile_schema(EvidenceFirst(titles, max_evidence=4), tok, len(tok))
    table = compiled.table
    answer = '{"evidence": ["Heat", "Heat (1995)", "Heathers"], "is_relevant": "YES"}'
    grammar = GrammarLogitsProcessor([compiled])
    for t in tok.encode(answer, add_special_tokens=False):
        assert t in _veto_matches_reference(grammar, grammar.trackers[0], table,
                                            torch.zeros(1, table.width))  # fmt: skip
        grammar.accept(0, t)
    grammar = GrammarLogitsProcessor([compiled])
    rng = np.random.default_rng(seed)
    for _ in range(400):
        if grammar.done(0):
            break
        scores = torch.from_numpy(rng.normal(0, 3, table.width).astype(np.float32))[None]
        left = _veto_matches_reference(grammar, grammar.trackers[0], table, scores)
        assert left, f"dead end after {grammar.text(0)!r}"
        grammar.accept(0, int(left[int(rng.integers(len(left)))]))


def test_token_tables_come_back_from_the_disk_cache_unchanged(tok, tmp_path, monkeypatch):
    """A token table read back from ``$RECJUDGE_CACHE`` equals the one built from the
    tokenizer (bytes of every token, stop ids, the grammar masks it gives); a damaged cache
    is rebuilt, and a changed tokenizer file is a different key."""
    monkeypatch.setenv("RECJUDGE_CACHE", str(tmp_path / "cache"))
    width = len(tok) + 64  # a logits width past the tokenizer, as models pad it
    built = GrammarCache().table(tok, width)
    (folder,) = (tmp_path / "cache" / "token-tables").iterdir()
    read = GrammarCache().table(tok, width)
    assert read.token_bytes == built.token_bytes and len(read.token_bytes) == width
    assert read.stop_ids == built.stop_ids and read.info.vocab_size == built.info.vocab_size
    schema = EvidenceFirst(["Heat (1995)", "Up (2009)"])
    masks = []
    for cache in (GrammarCache(), GrammarCache()):
        g = GrammarLogitsProcessor([cache.compile(schema, tok, width)])
        for t in tok.encode('{"evidence": ["He', add_special_tokens=False):
            g.accept(0, t)
        scores = torch.zeros(1, width)
        g.mask(scores)
        masks.append(torch.isfinite(scores))
    assert torch.equal(*masks)
    (folder / "bytes.bin").write_bytes(b"broken")
    again = GrammarCache().table(tok, width)
    assert again.token_bytes == built.token_bytes  # rebuilt, and written back
    assert (folder / "bytes.bin").stat().st_size == sum(map(len, built.token_bytes))
    # a copy of the tokenizer folder with one file changed is another key
    copy = tmp_path / "tok"
    shutil.copytree(tok.name_or_path, copy)
    tok.name_or_path, old = str(copy), tok.name_or_path
    try:
        key = _table_key(tok, width, [tok.eos_token_id])
        os.utime(copy / "tokenizer_config.json", ns=(1, 1))
        assert _table_key(tok, width, [tok.eos_token_id]) != key
    finally:
        tok.name_or_path = old
