"""The adversarial corpus through every schema's grammar on the real SmolLM2 tokenizer, with
the jump-forward the engines use asked at every step: never a crash, always valid JSON, and
only the given strings where the schema quotes them."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from test_titles import ADVERSARIAL

from recjudge.decoding import (
    Choice,
    CitedList,
    EvidenceFirst,
    GrammarLogitsProcessor,
    Picks,
    Verdicts,
    compile_schema,
)

STRINGS = list(ADVERSARIAL.values())
SCHEMAS = {
    "evidence-first": lambda: EvidenceFirst(STRINGS, max_evidence=4),
    "choice": lambda: Choice(STRINGS[:6], analysis_chars=30),
    "picks": lambda: Picks(STRINGS[:6], n=2),
    "cited-list": lambda: CitedList(STRINGS, max_words=3, max_items=2, max_ids=3),
    "verdicts": lambda: Verdicts(["accuracy", "overall"], STRINGS[:4], analysis_chars=20),
}


def _walk(compiled, seed: int, max_steps: int = 4000) -> str:
    """Random logits through the grammar; every step asks for the forced text (as the
    judge and ask() do) and takes it when the rest of the answer is forced."""
    g = np.random.default_rng(seed)
    grammar = GrammarLogitsProcessor([compiled])
    for _ in range(max_steps):
        assert isinstance(grammar.jump_forward(0), str)
        if grammar.finish_forced(0):
            break
        scores = torch.from_numpy(g.normal(0, 3, compiled.table.width).astype(np.float32))[None]
        grammar.mask(scores)
        assert torch.isfinite(scores[0]).any(), f"dead end after {grammar.text(0)!r}"
        token = int(scores[0].argmax())
        if token in compiled.table.stop_ids:
            break
        grammar.accept(0, token)
    assert grammar.done(0), grammar.text(0)
    return grammar.text(0)


@pytest.mark.parametrize("name", list(SCHEMAS))
@pytest.mark.parametrize("seed", range(4))
def test_adversarial_strings_through_every_schema(smollm, name, seed):
    schema = SCHEMAS[name]()
    compiled = compile_schema(schema, smollm.tokenizer, smollm.vocab_size)
    text = _walk(compiled, seed)
    value = schema.parse(text)  # valid for the schema, or this raises
    json.loads(text)
    quoted = {
        "evidence-first": lambda v: v["evidence"],
        "choice": lambda v: [v["answer"]],
        "picks": lambda v: v,
        "cited-list": lambda v: [i for it in v for i in it["ids"]],
        "verdicts": lambda v: [v["accuracy"], v["overall"]],
    }[name](value)
    assert set(quoted) <= set(STRINGS)
