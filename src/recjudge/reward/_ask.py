"""Closed questions through the reward core: grammar + branch record (+ bias), decoded by
``recjudge.decoding.decode`` (which picks the backend's path)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from recjudge.decoding import (
    BranchBias,
    ConstrainedOutput,
    DecodeJob,
    OptionJob,
    Schema,
    decode,
    json_literal,
)
from recjudge.llm import BestOption, OptionTrie, SamplingConfig, escape_special, option_tokens

if TYPE_CHECKING:
    from recjudge.llm import LLMBackend

SLOT = "<<recjudge-slot>>"


def ask(
    llm: LLMBackend,
    messages: Sequence[Sequence[dict[str, str]]],
    schemas: Schema | Sequence[Schema],
    *,
    signal: Sequence[Any] | None = None,
    bias: BranchBias | None = None,
    sampling: SamplingConfig | None = None,
    seeds: Sequence[int] | None = None,
    jump_forward_prefix: bool = True,
    decode_rows: int = 8,
    deterministic: bool = False,
) -> list[ConstrainedOutput]:
    """Ask each chat a grammar-constrained question.

    Every evaluator's closed question (verdicts, multiple choice, categories) goes through
    here, so parsing never fails and each answer carries its decision record (branch
    probabilities before and after any bias).

    Args:
        llm: a transformers backend.
        messages: one chat (list of role/content dicts) per question.
        schemas: one schema for all, or one per question.
        signal: optional sigma per question for the behavioural bias at the decision step.
        bias: the bias (``BranchBias``) applied with ``signal``.
        sampling: decoding settings (greedy by default; set max_new_tokens to fit).
        seeds: per-question seeds for sampling.
        jump_forward_prefix: prefill the answer's forced opening key instead of decoding it.
        decode_rows: rows per decode batch (questions in one batch share their common
            prompt prefix). With ``deterministic`` the fixed row count of every step.
        deterministic: the batch-invariant engine: an answer is bit-identical whatever the
            other questions (slower; see ``recjudge.llm._fast``).
    """
    n = len(messages)
    schemas = [schemas] * n if isinstance(schemas, Schema) else list(schemas)
    if len(schemas) != n:
        raise ValueError(f"{len(schemas)} schemas for {n} questions")
    job = DecodeJob(
        suffixes=[llm.encode(llm.chat_prompt(list(m))) for m in messages],
        schemas=schemas,
        signal=signal,
        bias=bias,
        sampling=sampling or SamplingConfig(max_new_tokens=512),
        seeds=seeds,
        jump_forward=jump_forward_prefix,
        rows=decode_rows,
        deterministic=deterministic,
    )
    return decode(llm, job)


def _slot_split(
    llm: LLMBackend, messages: Sequence[dict[str, str]], fills: Sequence[str], after: str = ""
) -> tuple[list[int], list[list[int]]]:
    """The chat's tokens up to the slot, and per fill the tokens from the slot to the end
    of the prompt, then those of ``after``."""
    text = llm.chat_prompt(list(messages))
    if text.count(" " + SLOT) != 1:
        raise ValueError(f"the chat must contain ' {SLOT}' exactly once")
    head, _, tail = text.partition(" " + SLOT)
    fill = [" " + escape_special(llm.tokenizer, str(f)) + tail for f in fills]
    # ``after`` (an answer's lead) is tokenised on its own, as decoding appends its lead.
    lead = llm.encode(after) if after else []
    return llm.encode(head), [llm.encode(f) + lead for f in fill]


def choose_shared(
    llm: LLMBackend,
    messages: Sequence[dict[str, str]],
    fills: Sequence[str],
    options: Sequence[str],
    *,
    answer_key: str = "answer",
    width: int = 16,
) -> list[BestOption]:
    """Answer one templated closed question for many fills by whole-option likelihood.

    The answer is the JSON ``{"<answer_key>": "<option>"}`` that ``Choice`` would decode,
    but the option is the one whose whole answer text is most likely (summed token
    log-probabilities, lm-eval's multiple-choice rule), found exactly by
    ``recjudge.decoding.OptionJob``; token-by-token constrained decoding instead falls into
    whichever option shares the first letters of the word the model starts (see
    ``recjudge.llm._choice``). The chat up to the slot is encoded once, as in
    ``ask_shared``; each fill's context once; the options' shared tokens once per fill.

    Args:
        llm: a transformers backend whose model the fast engine supports.
        messages: the chat with the slot.
        fills: the texts put in the slot (untrusted text is fine: it is only tokenised).
        options: the allowed answers.
        answer_key: the JSON key of the answer.
        width: open paths expanded per batched forward.
    """
    if not fills:
        return []
    lead, trie = _answer_trie(llm, options, answer_key)
    prefix, contexts = _slot_split(llm, messages, fills, after=lead)
    return decode(llm, OptionJob(prefix, contexts, trie, width))


def choose(
    llm: LLMBackend,
    messages: Sequence[Sequence[dict[str, str]]],
    options: Sequence[Sequence[str]],
    *,
    answer_key: str = "answer",
    width: int = 16,
) -> list[BestOption]:
    """``choose_shared`` for independent questions, each with its own options (e.g. a
    per-question shortlist): each chat is encoded once, then searched as there."""
    if len(options) != len(messages):
        raise ValueError(f"{len(options)} option lists for {len(messages)} questions")
    out = []
    for chat, opts in zip(messages, options, strict=True):
        lead, trie = _answer_trie(llm, opts, answer_key)
        ids = llm.encode(llm.chat_prompt(list(chat))) + llm.encode(lead)
        # The last token is the context whose next-token scores start the search.
        out.extend(decode(llm, OptionJob(ids[:-1], [ids[-1:]], trie, width)))
    return out


def _answer_trie(llm: LLMBackend, options: Sequence[str], answer_key: str) -> tuple[str, Any]:
    """The answer's lead (``{"<key>``) and the trie of every option's rest of the answer."""
    # Cut after the key's last letter, as ``decoding.lead_ids`` does: the model then
    # writes the merged '": "' tokens itself, as part of every option's text.
    lead = "{" + json_literal(answer_key)[:-1]
    answers = [escape_special(llm.tokenizer, f'": {json_literal(o)}}}') for o in options]
    return lead, OptionTrie(option_tokens(llm.encode, lead, answers))


def ask_shared(
    llm: LLMBackend,
    messages: Sequence[dict[str, str]],
    fills: Sequence[str],
    schemas: Schema | Sequence[Schema],
    *,
    sampling: SamplingConfig | None = None,
    decode_rows: int = 8,
    jump_forward_prefix: bool = True,
    deterministic: bool = False,
) -> list[ConstrainedOutput]:
    """Ask one templated question for many fills, encoding the shared part only once.

    ``messages`` is one chat whose last message contains ``" " + SLOT`` exactly once; the
    chat up to the slot is prefilled once and its KV cache reused for every fill (the
    suffix, from the fill to the end of the template, is decoded per fill).

    Args:
        llm: a transformers backend.
        messages: the chat with the slot.
        fills: the texts put in the slot (untrusted text is fine: it is only tokenised).
        schemas: one schema for all fills or one per fill.
        sampling: decoding settings (greedy by default).
        decode_rows: rows per decode batch (with ``deterministic``: the fixed row count).
        deterministic: the batch-invariant engine (bit-identical whatever the other fills).
    """
    n = len(fills)
    schemas = [schemas] * n if isinstance(schemas, Schema) else list(schemas)
    if len(schemas) != n:
        raise ValueError(f"{len(schemas)} schemas for {n} fills")
    if n == 0:
        return []
    prefix, suffixes = _slot_split(llm, messages, fills)
    job = DecodeJob(
        suffixes=suffixes,
        schemas=schemas,
        prefix=prefix,  # on vLLM its prefix cache shares the head
        sampling=sampling or SamplingConfig(max_new_tokens=256),
        jump_forward=jump_forward_prefix,
        rows=decode_rows,
        deterministic=deterministic,
    )
    return decode(llm, job)
