"""Closed choices by whole-option likelihood, searched exactly over the options' token trie.

Decoding an option under a grammar, token by token, commits to its first tokens greedily: a
model about to write an interest's own first word ("Drama") takes the allowed token "D" and is
then forced into whichever option starts so ("Diving"). The prefix trap decides the answer
before the option is read. Scoring whole options instead (lm-eval's multiple-choice rule,
``acc``) picks

    argmax_i  sum_j log p(t_ij | prompt, t_i1 .. t_i(j-1))

over the tokens ``t_i`` of each option's full answer text (closing quote and brace included,
so an option that is a prefix of another is still told apart). Scoring every option costs
one token per option token; here the argmax is found exactly by best-first search over the
token trie: a path's score bounds every option below it (log-probabilities are <= 0), so
the search stops as soon as the best finished option scores at least as much as every open
path. Each round expands the ``width`` best open paths in one batched forward.

Runs on the fast engine (``recjudge.llm._fast``): the shared prefix (e.g. a long category
list) is encoded once, each question's own context extends it once, and a path is one row.
On an engine backend (vLLM in process or a server) the same search asks the engine for the
log-probabilities of each open path's next tokens (``next_logprobs``: one generated step per
path, the trie's tokens watched), so the shared prefix stays in the engine's prefix cache.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from recjudge.llm._config import capabilities_of
from recjudge.llm._engine import EngineStats
from recjudge.llm._fast import (
    encode_prefix,
    extend_prefix,
    fast_attention,
    prefill_rows,
    prefixes_of,
)
from recjudge.llm._fast_loop import _Head

__all__ = ["BestOption", "OptionTrie", "best_options", "option_tokens"]


@dataclass
class _Node:
    children: dict[int, _Node] = field(default_factory=dict)
    ends: int | None = None  # index of the option whose tokens end here


class OptionTrie:
    """The options' token sequences as a trie (shared first tokens are scored once)."""

    def __init__(self, options: Sequence[Sequence[int]]) -> None:
        if not options:
            raise ValueError("no options")
        self.root = _Node()
        self.size = 0
        for i, toks in enumerate(options):
            if not toks:
                raise ValueError(f"option {i} has no tokens")
            node = self.root
            for t in toks:
                if t not in node.children:
                    node.children[t] = _Node()
                    self.size += 1
                node = node.children[t]
            if node.ends is not None:
                raise ValueError(f"options {node.ends} and {i} have the same tokens")
            node.ends = i


@dataclass(frozen=True)
class BestOption:
    """The chosen option, its summed log-probability and the paths the search expanded."""

    index: int
    logprob: float
    expanded: int


def option_tokens(encode: Any, lead: str, answers: Sequence[str]) -> list[list[int]]:
    """Each answer's tokens after ``lead`` as the tokenizer splits ``lead + answer`` (the
    model's own tokenization of the whole text; lm-eval's context/continuation split), or the
    answer encoded alone where the whole text does not start with ``lead``'s tokens."""
    head = list(encode(lead))
    out = []
    for a in answers:
        whole = list(encode(lead + a))
        out.append(whole[len(head) :] if whole[: len(head)] == head else list(encode(a)))
    return out


def best_options(
    backend: Any,
    prefix_ids: Sequence[int],
    contexts: Sequence[Sequence[int]],
    trie: OptionTrie,
    *,
    width: int = 16,
    stats: EngineStats | None = None,
) -> list[BestOption]:
    """For each context (the tokens after the shared ``prefix_ids``), the option of ``trie``
    with the highest summed log-probability; ties go to the lower option index.

    Needs a backend that declares ``option_scoring`` (a model the fast engine supports, or
    an engine backend with ``next_logprobs``).
    """
    if width < 1:
        raise ValueError("width must be >= 1")
    caps = capabilities_of(backend)
    if not caps.option_scoring:
        raise ValueError(f"{backend.name}: this backend does not score whole options")
    for ctx in contexts:
        if not ctx:
            raise ValueError("empty context")
    if caps.engine_constraints:
        prompts = [list(prefix_ids) + list(ctx) for ctx in contexts]
        return _engine_search(backend, prompts, trie, width, stats)
    return _local_options(backend, prefix_ids, contexts, trie, width, stats)


def _engine_search(
    backend: Any, prompts: list[list[int]], trie: OptionTrie, width: int,
    stats: EngineStats | None,
) -> list[BestOption]:  # fmt: skip
    """The searches of every prompt in lockstep, each round's open paths of all of them in
    one engine call (the engine batches them; each path's prompt shares its question's
    prefix in the engine's cache)."""

    def ask(jobs: list[tuple[int, tuple[int, ...], _Node]]) -> list[Any]:
        if stats is not None:
            stats.prefill_tokens += sum(len(prompts[q]) + len(p) for q, p, _ in jobs)
            stats.decode_steps += 1
        return backend.next_logprobs(
            [prompts[q] + list(p) for q, p, _ in jobs], [list(n.children) for _, _, n in jobs]
        )

    roots = ask([(q, (), trie.root) for q in range(len(prompts))])
    searches = {q: _search_steps(roots[q], trie, width) for q in range(len(prompts))}
    out: dict[int, BestOption] = {}
    pending: dict[int, Any] = {}
    for q, search in searches.items():
        _advance(search, None, q, pending, out)
    while pending:
        jobs = [(q, p, n) for q, batch in pending.items() for p, n in batch]
        lps = iter(ask(jobs))
        step = {q: [next(lps) for _ in batch] for q, batch in pending.items()}
        pending = {}
        for q, got in step.items():
            _advance(searches[q], got, q, pending, out)
    return [out[q] for q in range(len(prompts))]


def _advance(search: Any, sent: Any, key: Any, pending: dict, out: dict) -> None:
    """Send ``sent`` to a search (None: start it): its next batch goes to ``pending``, its
    result (when done) to ``out``."""
    try:
        pending[key] = search.send(sent)
    except StopIteration as done:
        out[key] = done.value


def _local_options(backend, prefix_ids, contexts, trie, width, stats) -> list[BestOption]:
    """The search on the fast engine: the prefix encoded once, each context extending it."""
    kv = prefixes_of(backend).get(
        "fast", prefix_ids, lambda: encode_prefix(backend, prefix_ids), stats
    )
    out = []
    for ctx in contexts:
        ext, hidden = extend_prefix(backend, kv, list(ctx))
        if stats is not None:
            stats.prefill_tokens += len(ctx)

        def expand(paths, ext=ext):
            with torch.inference_mode(), fast_attention(backend.model):
                _, h = prefill_rows(backend, ext, [p for p, _ in paths], stats=stats)
            return _logprobs(backend, h)

        search = _search_steps(_logprobs(backend, hidden[None])[0], trie, width)
        pending: dict[int, Any] = {}
        done: dict[int, BestOption] = {}
        _advance(search, None, 0, pending, done)
        while pending:
            _advance(search, expand(pending.pop(0)), 0, pending, done)
        out.append(done[0])
    return out


def _logprobs(backend: Any, hidden: torch.Tensor) -> torch.Tensor:
    """Next-token log-probabilities over the whole vocabulary (not renormalised to the
    trie's tokens: an option is scored by what the model would write unconstrained)."""
    with torch.inference_mode():  # the engine's LM head, full width, NaN/inf checked
        logits, _ = _Head(backend.model, None, backend.name)(hidden, [])
    return torch.log_softmax(logits, -1)


def _search_steps(root_lp: Any, trie: OptionTrie, width: int) -> Any:
    """Best-first search below the root (whose next-token log-probabilities are
    ``root_lp``), as a generator: it yields each round's open ``(path, node)`` batch, is
    sent their next-token log-probabilities (each indexable by token id: a tensor row, or a
    dict of the node's children), and returns the ``BestOption`` (so a caller can run many
    searches' rounds in one batch)."""
    best: tuple[float, int] | None = None  # (score, option)
    # Open paths as (-score, path, node); paths are unique, so nodes are never compared.
    heap: list[tuple[float, tuple[int, ...], _Node]] = []
    expanded = 0

    def children(path: tuple[int, ...], node: _Node, score: float, lp: Any) -> None:
        nonlocal best
        for tok, child in node.children.items():
            s = score + float(lp[tok])
            if child.ends is not None and (
                best is None or s > best[0] or (s == best[0] and child.ends < best[1])
            ):
                best = (s, child.ends)
            if child.children:
                heapq.heappush(heap, (-s, path + (tok,), child))

    children((), trie.root, 0.0, root_lp)
    while heap and (best is None or -heap[0][0] > best[0]):
        batch = []
        while heap and len(batch) < width and (best is None or -heap[0][0] > best[0]):
            batch.append(heapq.heappop(heap))
        lps = yield [(path, node) for _, path, node in batch]
        expanded += len(batch)
        for (neg, path, node), lp in zip(batch, lps, strict=True):
            children(path, node, -neg, lp)
    if best is None:  # unreachable: every trie path ends in an option
        raise RuntimeError("option search found no option")
    return BestOption(best[1], best[0], expanded)
