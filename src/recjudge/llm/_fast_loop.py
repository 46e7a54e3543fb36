"""The fast engine's decode loop: rows of several prefixes prefilled in one packed forward
(``prefill_rows``), then decoded together step by step with the grammar's forced text fed
as drafts (``_loop``), the LM head computed for the allowed tokens only (``_Head``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from recjudge.llm._engine import EngineStats, check_finite, sample_next
from recjudge.llm._fast_attention import _cpu_flash, _forward, _Packed, _Rows, fast_attention
from recjudge.llm._job import EngineJob, by_rows, chunks
from recjudge.llm._prefix_cache import PrefixKV


class _Head:
    """The LM head, computed only for the tokens some row may take next when ``allowed``
    knows them (fewer than ``MAX_SHARE`` of the vocabulary): a grammar-constrained step
    (inside a title, at the decision, in the closing keys) allows a few hundred of 50-150k
    tokens, and the head is 20-30 % of a small model's weights, all read at every step.
    The other scores are ``-inf``, as the grammar mask would set them; the computed ones are
    the same dot products (up to the kernel's rounding). NaN/inf in the computed scores stop
    the run (``check_finite``)."""

    MAX_SHARE = 0.25

    def __init__(self, model: Any, allowed: Any, name: str) -> None:
        self.layer = model.get_output_embeddings()
        self.allowed = allowed
        self.name = name
        self.width = int(self.layer.weight.shape[0])

    def __call__(
        self, hidden: torch.Tensor, rows: list[int]
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(scores [B, V] fp32, the ids computed or None for all)``."""
        ids = self.allowed(rows) if self.allowed is not None else None
        if ids is not None:
            # the grammar's ids come from the CPU; the head's weight may be on a GPU
            ids = ids.to(self.layer.weight.device)
            if 0 < ids.numel() <= self.MAX_SHARE * self.width:
                bias = self.layer.bias
                sub = torch.nn.functional.linear(
                    hidden, self.layer.weight.index_select(0, ids),
                    None if bias is None else bias.index_select(0, ids),
                ).float()  # fmt: skip
                check_finite(sub, self.name)
                out = torch.full((hidden.shape[0], self.width), float("-inf"), device=hidden.device)
                out[:, ids] = sub
                return out, ids
        logits = self.layer(hidden).float()
        check_finite(logits, self.name)
        return logits, None


def _greedy(scores: torch.Tensor, columns: torch.Tensor | None) -> torch.Tensor:
    """Each row's argmax, read from ``columns`` only when every other score is -inf (the
    same token: ``columns`` is sorted, and argmax takes the first of equal maxima)."""
    if columns is None:
        return scores.argmax(-1)
    return columns[scores[:, columns].argmax(-1)]


def fast_shared_prefix_decode(
    backend: Any, prefix: PrefixKV | None, suffix_ids: Sequence[Sequence[int]], job: EngineJob
) -> list[list[int]]:
    """Decode every suffix after one shared prefix (``None``: no prefix): ``fast_decode``
    with one prefix."""
    return fast_decode(backend, [prefix], [0] * len(suffix_ids), suffix_ids, job)


def fast_decode(
    backend: Any,
    prefixes: Sequence[PrefixKV | None],
    prefix_of: Sequence[int],
    suffix_ids: Sequence[Sequence[int]],
    job: EngineJob,
) -> list[list[int]]:
    """Decode every suffix ``i`` after ``prefixes[prefix_of[i]]``, rows of every prefix in
    the same steps.

    The hooks' contract is ``EngineJob``'s: ``step(scores, rows)`` modifies the rows' fp32
    next-token scores in place (grammar mask, then bias), ``accept(row, token)`` follows
    each chosen token and ``finished(row)`` ends a row; rows are the caller's indices,
    results come back in the caller's order. Rows are decoded ``job.rows`` at a time,
    ordered by prefix. ``job.draft(row)``: the row's likely next tokens, verified in the
    row's next forward (``_loop``).
    """
    n = len(suffix_ids)
    order = sorted(range(n), key=lambda i: prefix_of[i])  # stable: a prefix's rows together

    def one_chunk(rows: list[int]) -> list[list[int]]:
        used = sorted({prefix_of[r] for r in rows})
        local = {p: i for i, p in enumerate(used)}
        return _decode_chunk(backend, [prefixes[p] for p in used],
                             [local[prefix_of[r]] for r in rows],
                             [list(suffix_ids[r]) for r in rows], job.subset(rows))  # fmt: skip

    return by_rows(n, chunks([order], job.rows), one_chunk)


def _decode_chunk(backend, prefixes, group, suffixes, job: EngineJob):
    model = backend.model
    with torch.inference_mode(), fast_attention(model):
        st, hidden = prefill_rows(
            backend, prefixes, suffixes, job.sampling.max_new_tokens, job.stats, prefix_of=group
        )
        head = _Head(model, job.allowed, backend.name)
        logits, columns = head(hidden, list(range(len(suffixes))))
        return _loop(model, st, logits, columns, job, head)


#: decode slots allocated per row at prefill (a judge's answer is ~20-60 tokens); more are
#: added by doubling when an answer runs longer
FIRST_ROOM = 64


def prefill_rows(
    backend: Any,
    prefix: PrefixKV | None | Sequence[PrefixKV | None],
    suffixes: Sequence[Sequence[int]],
    extra: int = 0,
    stats: EngineStats | None = None,
    prefix_of: Sequence[int] | None = None,
) -> tuple[_Rows, torch.Tensor]:
    """Prefill each row's ``suffix`` after ``prefix`` in one forward (with ``prefix_of``,
    ``prefix`` is a list and row ``r`` follows ``prefix[prefix_of[r]]``; rows ordered by
    prefix); returns the rows' buffers (room for up to ``extra`` more tokens each, grown on
    demand) and each row's last hidden state ``[B, H]``.

    Runs inside ``torch.inference_mode()`` and ``fast_attention(model)``.
    """
    model = backend.model
    dev = model.device
    n = len(suffixes)
    prefixes = list(prefix) if prefix_of is not None else [prefix]  # type: ignore[arg-type]
    group = list(prefix_of) if prefix_of is not None else [0] * n
    lens = torch.tensor([len(s) for s in suffixes], device=dev)
    if int(lens.min()) < 1:
        raise ValueError("empty suffix")
    width = int(lens.max())
    # the first steps' room; ``_Rows.reserve`` grows it as answers get longer
    st = _Rows(model, prefixes, group, width + min(extra, FIRST_ROOM))
    st.width = width
    if _cpu_flash(dev):
        # The rows' tokens one after another, no pad (a batch of one user's candidates
        # padded to its longest suffix computed 39 % pad tokens in the throughput bench).
        st.packed = pk = _Packed.of(lens)
        flat = torch.tensor([t for s in suffixes for t in s], dtype=torch.long, device=dev)
        try:
            hidden = _forward(model, st, flat[None], (st.plen[pk.row] + pk.slot)[None], None)
        finally:
            st.packed = None
        last = hidden[0, pk.start + lens - 1]
    else:
        last = _padded_prefill(backend, st, suffixes, lens, width)
    st.lens = lens.clone()
    if stats is not None:
        stats.prefill_tokens += int(lens.sum())
        stats.rows += n
    return st, last


def _padded_prefill(backend, st, suffixes, lens, width):
    """``prefill_rows`` as a ``[rows, width]`` batch (devices without the CPU kernels);
    returns each row's last hidden state."""
    model = backend.model
    dev = model.device
    n = len(suffixes)
    ids = torch.full((n, width), backend.tokenizer.pad_token_id, dtype=torch.long, device=dev)
    for r, s in enumerate(suffixes):
        ids[r, : len(s)] = torch.tensor(list(s), dtype=torch.long, device=dev)
    # Causal within each row's suffix; pad slots (at or past a row's length) are never keys.
    slot = torch.arange(width, device=dev)
    visible = (slot[None, None, :] <= slot[None, :, None]) & (
        slot[None, None, :] < lens[:, None, None]
    )
    mask = torch.zeros(n, 1, width, width, device=dev).masked_fill(~visible[:, None], float("-inf"))
    hidden = _forward(model, st, ids, st.plen[:, None] + slot[None], mask)
    return hidden[torch.arange(n, device=dev), lens - 1]


def extend_prefix(backend: Any, prefix: PrefixKV, ids: Sequence[int]) -> tuple[PrefixKV, Any]:
    """``prefix`` followed by ``ids`` as a new prefix (only ``ids`` are computed), and the
    last position's hidden state ``[H]``: a per-question context after a shared prefix, then
    shared again by many short continuations."""
    with torch.inference_mode(), fast_attention(backend.model):
        st, hidden = prefill_rows(backend, prefix, [ids])
    n = len(ids)
    keys = [torch.cat([k, st.k[i, :, 0, :n]], 1) for i, k in enumerate(prefix.keys)]
    values = [torch.cat([v, st.v[i, :, 0, :n]], 1) for i, v in enumerate(prefix.values)]
    return PrefixKV(keys, values, prefix.length + n), hidden[0]


#: most draft tokens fed per row and step: a forced span is a title's remainder or a key
#: (~5 tokens on average in evidence-heavy answers); a longer one is continued next step
MAX_DRAFT = 16


def _loop(model, st, logits, columns, job: EngineJob, head):
    """Decode until every row is finished; ``st`` holds the rows' prefilled slots.
    ``columns``: the ids the head computed (the other scores are -inf), passed on to
    ``step`` as its third argument so it reads only them; None: the whole vocabulary.

    ``job.draft(row)``: the token ids the grammar forces after the row's text (a guess of its
    next tokens, e.g. the rest of a title once its first tokens single it out). A row is then
    fed its chosen token and its draft in one forward (speculative decoding with the grammar
    as the drafter), and the outputs are read in order, as the steps they replace: each
    position's scores go through ``step`` after the tokens before it were accepted, its
    token is chosen as usual, and reading goes on while the chosen token equals the draft's
    next one. The first token that differs is the row's next token; the draft's keys and
    values after it are dropped (the row's length stops before them). So the tokens, scores
    and hooks' calls are those of one token per step, up to the rounding of a different
    batch shape; only the number of forwards drops.
    """
    run = _Decoding(job, head, logits.shape[0], st.device)
    hidden: torch.Tensor | None = None  # the last forward's outputs, [tokens, H]
    starts: list[int] = []  # where each active row's tokens begin in ``hidden``
    while True:
        last, valid, alive = run.read(hidden, starts, logits, columns)
        if hidden is not None:
            st.lens = st.lens + torch.tensor(valid, device=st.device)
        keep = [i for i, a in enumerate(alive) if a]
        if not keep:
            return run.out
        if len(keep) < len(run.active):
            st.keep(torch.tensor(keep, device=st.device))
            run.active = [run.active[i] for i in keep]
        fed = run.feed(keep, last, valid)
        hidden, starts = _step(model, st, fed)
        if job.stats is not None:
            job.stats.decode_steps += 1
            job.stats.decode_tokens += hidden.shape[0]
            job.stats.draft_tokens += hidden.shape[0] - len(fed)


class _Decoding:
    """``_loop``'s rows: their tokens so far (``out``, by row), the rows still decoding
    (``active``), each active row's draft fed in the last forward, and each row's draft
    length (``cap``: shrinks where the model left its drafts)."""

    def __init__(self, job: EngineJob, head: _Head, n: int, device: Any) -> None:
        self.job, self.head = job, head
        self.gens = None
        if job.sampling.do_sample:
            self.gens = [torch.Generator(device=device).manual_seed(job.seed(r) % (2**63))
                         for r in range(n)]  # fmt: skip
        self.out: list[list[int]] = [[] for _ in range(n)]
        self.active = list(range(n))
        self.drafts: list[list[int]] = [[] for _ in range(n)]  # by active index
        self.cap = [MAX_DRAFT] * n

    def read(self, hidden, starts, logits, columns) -> tuple[list[int], list[int], list[bool]]:
        """Read the last forward's outputs in order, each active row as far as its draft was
        taken (``logits``/``columns``: the prefill's, before the first forward). Returns each
        active row's last chosen token, how many of the forward's tokens stand (their keys
        and values kept), and whether the row goes on."""
        job, active = self.job, self.active
        b = len(active)
        last, valid, alive = [0] * b, [0] * b, [False] * b
        follow = list(range(b))  # rows still reading their outputs
        j = 0
        while follow:
            rows = [active[i] for i in follow]
            if hidden is not None:
                at = torch.tensor([starts[i] + j for i in follow], device=hidden.device)
                logits, columns = self.head(hidden[at], rows)
            if columns is None:
                job.step(logits, rows)
            else:
                job.step(logits, rows, columns)
            if job.sampling.do_sample:
                nxt = sample_next(logits, job.sampling, [self.gens[r] for r in rows])
            else:
                nxt = _greedy(logits, columns)
            more = []
            for i, tok in zip(follow, nxt.tolist(), strict=True):
                row = active[i]
                self.out[row].append(tok)
                job.accept(row, tok)
                last[i] = tok
                valid[i] += hidden is not None
                alive[i] = (
                    not job.finished(row) and len(self.out[row]) < job.sampling.max_new_tokens
                )
                if alive[i] and j < len(self.drafts[i]) and tok == self.drafts[i][j]:
                    more.append(i)
            if job.stats is not None and j > 0:
                job.stats.draft_accepted += len(follow)
            follow = more
            j += 1
        return last, valid, alive

    def feed(self, keep: list[int], last: list[int], valid: list[int]) -> list[list[int]]:
        """What each kept row is fed next: its chosen token and a fresh draft."""
        fed, guesses = [], []
        for i, row in zip(keep, self.active, strict=True):
            # A draft left before its last token (another tokenization, or the model going
            # its own way past a distinct-evidence veto) wasted the rest: the row's next
            # drafts are cut to what it took (its outputs read past the first), then doubled
            # back while they are taken (the extra tokens cost compute where a step is
            # compute-bound, as on small CPUs).
            if self.drafts[i]:
                took = valid[i] - 1
                ok = took >= len(self.drafts[i]) - 1
                self.cap[row] = min(2 * self.cap[row], MAX_DRAFT) if ok else max(took, 1)
            room = self.job.sampling.max_new_tokens - len(self.out[row]) - 1
            draft = self.job.draft
            guess = draft(row)[: min(self.cap[row], room)] if draft is not None and room > 0 else []
            guesses.append(guess)
            fed.append([last[i], *guess])
        self.drafts = guesses
        return fed


def _step(model, st, fed: list[list[int]]) -> tuple[torch.Tensor, list[int]]:
    """One decode forward: row ``r`` is fed ``fed[r]`` at its next positions (one token
    each: a ``[B, 1]`` batch; else packed, ``_packed_step``). Returns the outputs
    ``[tokens, H]`` and where each row's begin."""
    dev = st.device
    b = len(fed)
    counts = torch.tensor([len(f) for f in fed], device=dev)
    wide = int(counts.max())
    st.write = st.lens.clone()
    st.width = int((st.lens + counts).max())
    st.reserve(st.width)
    slot = torch.arange(st.width, device=dev)
    # row r's query j sees its slots up to lens[r] + j (its own new tokens causally)
    sees = st.lens[:, None] + torch.arange(wide, device=dev)[None]  # [B, L]
    mask = torch.zeros(b, 1, wide, st.width, device=dev).masked_fill(
        (slot[None, None, :] > sees[:, :, None])[:, None], float("-inf")
    )
    if wide == 1:
        ids = torch.tensor([f[0] for f in fed], dtype=torch.long, device=dev)
        hidden = _forward(model, st, ids[:, None], (st.plen + st.lens)[:, None], mask)
        return hidden[:, -1], list(range(b))
    pk = _Packed.of(counts)
    flat = torch.tensor([t for f in fed for t in f], dtype=torch.long, device=dev)
    st.step, st.step_mask = pk, mask
    try:
        pos = (st.plen[pk.row] + st.lens[pk.row] + pk.slot)[None]
        hidden = _forward(model, st, flat[None], pos, None)
    finally:
        st.step = st.step_mask = None
    return hidden[0], pk.start.tolist()


__all__ = ["FIRST_ROOM", "MAX_DRAFT", "extend_prefix", "fast_decode",
           "fast_shared_prefix_decode", "prefill_rows"]  # fmt: skip
