"""Logits processors: the grammar mask and the entropy-adaptive branch bias.

Both follow the transformers ``LogitsProcessor`` contract ``__call__(input_ids[B, T],
scores[B, V]) -> scores`` and keep per-row state, so one instance serves one batch of one
generation (create a new one per ``generate`` call). Both modify ``scores`` in place and
return it. Order: grammar first, then bias; temperature/top-p/top-k come after both.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from recjudge.decoding._compile import CompiledSchema
from recjudge.decoding._schemas import DecisionSpec, json_literal, live_branches

NEG_INF = float("-inf")


# -- evidence distinctness --------------------------------------------------------------
class _EvidenceTracker:
    """Tracks a list of distinct strings (evidence titles, picked labels) in one row and
    vetoes tokens that would repeat one.

    Strings are handled in their JSON-escaped form; a string's key is its escaped content
    plus the closing quote, so strings that are prefixes of others stay distinct.

    Args:
        opening: the text that opens the list, e.g. ``{"evidence": [``.
        strings: the allowed strings.
        encode: renders a string as the JSON literal the model emits.
    """

    def __init__(
        self, opening: str, strings: Sequence[str], encode: Callable[[str], str] = json_literal
    ) -> None:
        self.OPEN = opening.encode()
        self.keys = sorted(encode(t)[1:].encode() for t in strings)
        self.cited: set[bytes] = set()
        self.state = "pre"  # pre -> item -> in -> after -> sep -> item ... -> done
        self.partial = b""
        self.prefix = b""

    def _step(
        self, state: str, partial: bytes, cited: set[bytes], data: bytes
    ) -> tuple[str, bytes, bool]:
        """Advance over ``data``; returns (state, partial, ok). ``cited`` is updated in place."""
        for c in data:
            ch = bytes((c,))
            if state == "item":
                if ch == b'"':
                    state, partial = "in", b""
                elif ch == b"]":
                    state = "done"
            elif state == "in":
                partial += ch
                if ch == b'"':
                    body = partial[:-1]
                    escapes = len(body) - len(body.rstrip(b"\\"))
                    if escapes % 2 == 0:  # an unescaped quote closes the title
                        if partial in cited:
                            return state, partial, False
                        cited.add(partial)
                        state = "after"
            elif state == "after":
                state = "sep" if ch == b"," else ("done" if ch == b"]" else state)
            elif state == "sep" and ch == b" ":
                state = "item"
        return state, partial, True

    def _viable(self, state: str, partial: bytes, cited: set[bytes]) -> bool:
        if state in ("item", "sep"):
            return len(cited) < len(self.keys)
        if state == "in":
            lo = bisect.bisect_left(self.keys, partial)
            for key in self.keys[lo:]:
                if not key.startswith(partial):
                    return False
                if key not in cited:
                    return True
            return False
        return True

    def feed(self, data: bytes) -> None:
        if self.state == "pre":
            self.prefix += data
            if len(self.prefix) < len(self.OPEN):
                return
            if not self.prefix.startswith(self.OPEN):
                self.state = "done"
                return
            data, self.state = self.prefix[len(self.OPEN) :], "item"
        self.state, self.partial, _ = self._step(self.state, self.partial, self.cited, data)

    def active(self) -> bool:
        return self.state not in ("pre", "done") and bool(self.cited)

    def allows(self, data: bytes) -> bool:
        if self.state == "in" and b'"' not in data:
            # inside a string, a token without a quote only extends it (the common case,
            # checked without copying the cited set)
            return self._viable("in", self.partial + data, self.cited)
        cited = set(self.cited)
        state, partial, ok = self._step(self.state, self.partial, cited, data)
        return ok and self._viable(state, partial, cited)

    def clear_of_cited(self) -> bool:
        """Inside a string that no cited string continues: then a token without a quote
        cannot lead to a repeat (the grammar keeps the string a prefix of an allowed one,
        and none of those is cited), so only tokens with a quote need ``allows``."""
        return self.state == "in" and not any(c.startswith(self.partial) for c in self.cited)


def veto_repeats(
    tracker: _EvidenceTracker | None,
    row: torch.Tensor,
    table: Any,
    columns: torch.Tensor | None = None,
) -> None:
    """Mask (in place) the allowed tokens of one logits row that would repeat a string the
    tracker has already seen in its list (``table``: the ``TokenTable``; ``columns``: the
    only ids that may be finite). Inside a string that no cited one continues, only the
    tokens holding a quote are candidates (``_EvidenceTracker.clear_of_cited``), read from
    ``table.quote_ids()`` rather than from a pass over the whole row."""
    if tracker is None or not tracker.active():
        return
    token_bytes = table.token_bytes
    quoted = tracker.clear_of_cited()
    if columns is not None:
        allowed = columns[torch.isfinite(row[columns])].tolist()
    elif quoted:
        ids = table.quote_ids().to(row.device)
        allowed = ids[torch.isfinite(row[ids])].tolist()
    else:
        allowed = torch.isfinite(row).nonzero().flatten().tolist()
    veto = [
        t
        for t in allowed
        if t < len(token_bytes)
        and token_bytes[t]
        and (not quoted or b'"' in token_bytes[t])
        and not tracker.allows(token_bytes[t])
    ]
    if veto:
        row[veto] = NEG_INF


def forced_text(matcher: Any) -> str:
    """The text ``matcher``'s grammar forces next ("" if there is a choice).

    xgrammar hands the forced bytes over as ``str``; when they begin or end inside a
    multi-byte UTF-8 character (a CJK, emoji or mathematical-letter title after a byte-level
    token, or two titles sharing a character's first bytes) that conversion raises
    ``UnicodeDecodeError``. Then nothing is jumped: decoding token by token reaches the same
    text, and the jump is taken again once the character is complete.
    """
    try:
        return matcher.find_jump_forward_string()
    except UnicodeDecodeError:
        return ""


class GrammarLogitsProcessor:
    """Masks logits to a compiled schema, one xgrammar matcher per batch row.

    Rows may use different schemas (e.g. each user's own titles). Tokens outside the grammar
    get ``-inf``; for ``EvidenceFirst`` a title already cited is also masked, so evidence is
    always distinct. Rows whose grammar has terminated may only emit a stop token.
    Modifies ``scores`` in place.

    Args:
        compiled: one compiled schema per row, or one for all rows with ``batch_size``.
        batch_size: number of rows when ``compiled`` is a single schema.
    """

    def __init__(
        self, compiled: CompiledSchema | Sequence[CompiledSchema], batch_size: int | None = None
    ) -> None:
        # xgrammar loads with the first grammar, not with this module
        import xgrammar as xgr  # noqa: PLC0415

        if isinstance(compiled, CompiledSchema):
            if batch_size is None or batch_size < 1:
                raise ValueError("give batch_size >= 1 with a single compiled schema")
            rows = [compiled] * batch_size
        else:
            rows = list(compiled)
            if not rows:
                raise ValueError("need at least one compiled schema")
        widths = {c.table.width for c in rows}
        if len(widths) != 1:
            raise ValueError(f"rows were compiled for different vocab widths: {widths}")
        self.rows = rows
        self.table = rows[0].table
        self.width = self.table.width
        self._xgr = xgr
        self.matchers = [xgr.GrammarMatcher(c.grammar) for c in rows]
        self.generated = [bytearray() for _ in rows]
        self.token_ids: list[list[int]] = [[] for _ in rows]
        self.trackers = [
            _EvidenceTracker(*c.schema.distinct_list(), c.table.json_literal)
            if c.schema.distinct_list() is not None
            else None
            for c in rows
        ]
        self._bitmask = xgr.allocate_token_bitmask(len(rows), self.width)
        #: the rows whose masks ``_bitmask`` holds (filled by ``allowed``, still current: no
        #: token accepted since), so ``mask`` on the same rows does not fill them again
        self._filled: tuple[int, ...] | None = None
        self._prompt_len: int | None = None

    @property
    def batch_size(self) -> int:
        return len(self.rows)

    def done(self, row: int) -> bool:
        """The row's text is a complete match (its stop token may not have been seen yet)."""
        return self.matchers[row].is_completed() or self.matchers[row].is_terminated()

    def text(self, row: int) -> str:
        return self.generated[row].decode("utf-8", errors="replace")

    def accept(self, row: int, token: int) -> None:
        """Advance row ``row`` by ``token`` (used by engines that do not pass input_ids)."""
        m = self.matchers[row]
        self._filled = None
        if m.is_terminated():
            return  # padding after the end
        if not m.accept_token(token):
            raise RuntimeError(
                f"row {row}: token {token} ({self.table.token_bytes[token]!r}) is not allowed "
                f"after {bytes(self.generated[row])[-80:]!r}; was the grammar processor "
                "applied before sampling?"
            )
        data = self.table.token_bytes[token]
        self.generated[row] += data
        self.token_ids[row].append(token)
        if self.trackers[row] is not None:
            self.trackers[row].feed(data)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if scores.dim() != 2 or scores.shape[0] != self.batch_size:
            raise ValueError(f"scores must be [B={self.batch_size}, V], got {tuple(scores.shape)}")
        if scores.shape[1] != self.width:
            raise ValueError(
                f"scores width {scores.shape[1]} != grammar width {self.width}; "
                "compile with the model's logits width"
            )
        if self._prompt_len is None:
            self._prompt_len = input_ids.shape[1]
        else:
            last = input_ids[:, -1].tolist()
            for row, tok in enumerate(last):
                self.accept(row, int(tok))
        self.mask(scores)
        return scores

    def mask(
        self,
        scores: torch.Tensor,
        rows: Sequence[int] | None = None,
        columns: torch.Tensor | None = None,
    ) -> None:
        """Apply the grammar (and evidence distinctness) to ``scores`` in place.

        ``rows[i]`` names the processor row that ``scores[i]`` belongs to (default: all rows
        in order), so an engine can drop finished rows from its batch. ``columns``: the only
        token ids that may hold a finite score (sorted int64, e.g. an LM head computed for
        ``allowed``'s ids; every other score is ``-inf`` already): the grammar is then
        applied to those columns only, not to the whole vocabulary.
        """
        rows = list(range(self.batch_size)) if rows is None else list(rows)
        if len(rows) != scores.shape[0]:
            raise ValueError(f"{scores.shape[0]} score rows for {len(rows)} processor rows")
        bitmask = self._bitmask[: len(rows)]
        terminated = []
        if self._filled != tuple(rows):
            self._filled = None  # the bitmask is rewritten below (terminated rows as all-ones)
            for i, row in enumerate(rows):
                m = self.matchers[row]
                if m.is_terminated():
                    terminated.append(i)
                    bitmask[i].fill_(-1)
                else:
                    m.fill_next_token_bitmask(bitmask, i)
        if columns is None:
            # xgrammar's matchers fill a CPU bitmask; its kernel wants it beside the logits.
            self._xgr.apply_token_bitmask_inplace(
                scores, bitmask.to(scores.device, non_blocking=True)
            )
        else:
            cols = columns.to(bitmask.device)
            keep = ((bitmask[:, cols >> 5] >> (cols & 31).to(bitmask.dtype)) & 1).bool()
            cols = columns.to(scores.device)
            sub = scores[:, cols]
            sub.masked_fill_(~keep.to(scores.device), NEG_INF)
            scores[:, cols] = sub
        for i in terminated:
            stop = self.table.stop_ids[0] if self.table.stop_ids else 0
            scores[i].fill_(NEG_INF)
            scores[i, stop] = 0.0
        for i, row in enumerate(rows):
            tracker = self.trackers[row]
            if tracker is not None and i not in terminated:
                veto_repeats(tracker, scores[i], self.table,
                             None if columns is None else columns.to(scores.device))  # fmt: skip

    def allowed(self, rows: Sequence[int]) -> torch.Tensor | None:
        """The token ids any of ``rows`` may take next under its grammar (sorted, int64),
        or None where a row has terminated (it may take only a stop token, which ``mask``
        handles). Distinct-evidence vetoes are not applied here (``mask`` does)."""
        rows = list(rows)
        if any(self.matchers[r].is_terminated() for r in rows):
            return None
        bitmask = self._bitmask[: len(rows)]
        for i, row in enumerate(rows):
            self.matchers[row].fill_next_token_bitmask(bitmask, i)
        self._filled = tuple(rows)
        # Only the 32-token words some row allows are expanded to bits (a few of ~4700).
        words = (bitmask != 0).any(0).nonzero().squeeze(1)
        union = bitmask[:, words]
        acc = union[0].clone()
        for r in range(1, len(rows)):
            acc |= union[r]
        shifts = torch.arange(32, dtype=bitmask.dtype, device=bitmask.device)
        bits = ((acc.unsqueeze(-1) >> shifts) & 1).bool()  # word w, bit j: token 32 w + j
        ids = (words.unsqueeze(-1) * 32 + shifts.long())[bits]
        return ids[ids < self.width]

    def jump_forward(self, row: int) -> str:
        """The text the grammar forces next for ``row`` (empty if there is a choice)."""
        return forced_text(self.matchers[row])

    def finish_forced(self, row: int) -> bool:
        """Jump-forward to the end: if everything left for ``row`` is forced by the grammar,
        accept it as text now (no model steps) and return True; else change nothing."""
        m = self.matchers[row]
        if m.is_completed() or m.is_terminated():
            return True
        rest = forced_text(m)
        if not rest:
            return False
        probe = m.fork()
        if not (probe.accept_string(rest) and probe.is_completed()):
            return False
        self._filled = None
        m.accept_string(rest)
        data = rest.encode()
        self.generated[row] += data
        if self.trackers[row] is not None:
            self.trackers[row].feed(data)
        return True


# -- branch bias ------------------------------------------------------------------------
@dataclass(frozen=True)
class DecisionStep:
    """The unbiased scores at one decision step, enough to replay it under any bias.

    Attributes:
        live: indices of the branches that could be decided at this step.
        lse: per live branch, ``logsumexp`` of its tokens' scores (gives ``p`` and ``E_n``).
        top: per live branch, its best token's score (what greedy compares).
        other: the best score among the allowed tokens that decide nothing yet
            (``-inf`` when every allowed token decides a branch).
    """

    live: tuple[int, ...]
    lse: tuple[float, ...]
    top: tuple[float, ...]
    other: float


@dataclass
class DecisionRecord:
    """What happened at a row's decision step.

    Attributes:
        branches: branch names (``("YES", "NO")`` for evidence-first).
        p_before: branch probabilities (mass of each branch's tokens, normalised over the
            branches) after the grammar mask, before the bias.
        p_after: the same after the bias.
        entropy: normalised entropy ``E_n = H(p_before) / ln k``.
        delta: the logit shift added to each branch (``+Delta, -Delta`` for YES/NO).
        signal: the behavioural signal per branch (``+sigma, -sigma`` for YES/NO).
        beta: bias strength; adaptive: whether ``(1 + E_n)`` scaled it.
        step: index of the generated token chosen at the (last) decision step.
        decision_steps: steps at which every branch could be decided (bias applied each time).
        blocked_steps: steps at which one-sided deciding tokens were masked.
        chosen: the branch the row committed to, once known.
        steps: the unbiased scores at each decision step (``replay_greedy`` re-decides
            the row under another bias from them).
    """

    branches: tuple[str, ...]
    p_before: tuple[float, ...] = ()
    p_after: tuple[float, ...] = ()
    entropy: float = 0.0
    delta: tuple[float, ...] = ()
    signal: tuple[float, ...] = ()
    beta: float = 0.0
    adaptive: bool = True
    step: int = -1
    decision_steps: int = 0
    blocked_steps: int = 0
    chosen: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    steps: list[DecisionStep] = field(default_factory=list, repr=False)

    def _p(self, probs: tuple[float, ...], name: str) -> float | None:
        if name not in self.branches:
            return None
        if not probs:  # a single-branch decision (e.g. no titles to cite) is certain
            return 1.0 if len(self.branches) == 1 else None
        return probs[self.branches.index(name)]

    @property
    def p_yes_before(self) -> float | None:
        p = self._p(self.p_before, "YES")
        return 0.0 if p is None and self.branches == ("NO",) else p

    @property
    def p_yes_after(self) -> float | None:
        p = self._p(self.p_after, "YES")
        return 0.0 if p is None and self.branches == ("NO",) else p

    @property
    def delta_yes(self) -> float:
        return self.delta[0] if self.delta else 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("steps")
        d["p_yes_before"], d["p_yes_after"] = self.p_yes_before, self.p_yes_after
        return d


def zero_signal(spec: DecisionSpec) -> float | list[float]:
    """No behavioural signal: 0 for a binary decision, a zero vector for a k-way one."""
    k = len(spec.names)
    return 0.0 if k <= 2 else [0.0] * k


def branch_deltas(
    p: np.ndarray, signal: np.ndarray, beta: float, adaptive: bool
) -> tuple[np.ndarray, float]:
    """``delta_i = beta * (1 + E_n) * s_i`` (adaptive) or ``beta * s_i``; E_n = H(p) / ln k.

    Returns the per-branch deltas and E_n. With one branch, E_n = 0.
    """
    k = len(p)
    nz = p[p > 0]
    entropy = float(-(nz * np.log(nz)).sum() / math.log(k)) if k > 1 else 0.0
    scale = beta * (1.0 + entropy) if adaptive else beta
    return scale * signal, entropy


class BranchBiasProcessor:
    """Adds the behavioural bias at the decision step of each row.

    While a row's generated text has not committed to a branch, every finite-logit token
    (the grammar processor must run first and mask the rest with ``-inf``) is classified by
    its bytes as deciding one branch, or undecided. If some but not all branches can be
    decided at a step, the deciding tokens are masked so the decision waits for a step where
    all can (``block_one_sided``). At a step where all can, the branch masses
    ``p_i = softmax_i(logsumexp(scores[branch i tokens]))`` give ``E_n = H(p) / ln k`` and
    ``delta_i = beta * (1 + E_n) * s_i`` is added to branch i's tokens. For the binary
    evidence decision ``s = (+sigma, -sigma)``, i.e. ``+Delta`` on YES and ``-Delta`` on NO.
    With ``beta = 0`` the bias adds exactly zero. Modifies ``scores`` in place.

    Args:
        decisions: one DecisionSpec per row, or one for all rows.
        token_bytes: bytes of each token id (``TokenTable.token_bytes``).
        signal: per row, sigma (binary decisions) or a vector of k per-branch signals.
        beta: bias strength, one for all rows or one per row.
        adaptive: scale by ``1 + E_n`` (BRIEF) or not (the non-adaptive ablation).
        block_one_sided: mask deciding tokens until all branches are decidable at once.
    """

    def __init__(
        self,
        decisions: DecisionSpec | Sequence[DecisionSpec],
        token_bytes: Sequence[bytes],
        signal: Sequence[float] | Sequence[Sequence[float]],
        beta: float | Sequence[float] = 25.0,
        adaptive: bool = True,
        block_one_sided: bool = True,
    ) -> None:
        n = len(signal)
        if n < 1:
            raise ValueError("signal needs one entry per batch row")
        specs = [decisions] * n if isinstance(decisions, DecisionSpec) else list(decisions)
        if len(specs) != n:
            raise ValueError(f"{len(specs)} decision specs for {n} rows")
        betas = [float(beta)] * n if isinstance(beta, int | float) else [float(b) for b in beta]
        if len(betas) != n:
            raise ValueError(f"{len(betas)} betas for {n} rows")
        self.signals: list[np.ndarray] = []
        for row, (spec, s) in enumerate(zip(specs, signal, strict=True)):
            k = len(spec.names)
            if isinstance(s, int | float | np.floating):
                if k > 2:
                    raise ValueError(f"row {row}: a {k}-way decision needs a signal vector")
                vec = np.array([float(s), -float(s)][:k])
                if k == 1:
                    vec = np.zeros(1)
            else:
                vec = np.asarray(s, dtype=float)
                if vec.shape != (k,):
                    raise ValueError(f"row {row}: signal has shape {vec.shape}, need ({k},)")
            if not np.all(np.isfinite(vec)):
                raise ValueError(
                    f"row {row}: signal {vec} is not finite (map unknown items "
                    "to sigma = 0 before decoding)"
                )
            self.signals.append(vec)
        for row, b in enumerate(betas):
            if not math.isfinite(b):
                raise ValueError(f"row {row}: beta {b} is not finite")
        self.specs = specs
        self.betas = betas
        self.adaptive = adaptive
        self.block_one_sided = block_one_sided
        self.token_bytes = token_bytes
        self._markers = [tuple(m.encode() for m in s.markers) for s in specs]
        self.generated = [bytearray() for _ in range(n)]
        self.n_generated = [0] * n
        self.records = [
            DecisionRecord(branches=tuple(s.names), signal=tuple(v), beta=b, adaptive=adaptive)
            for s, v, b in zip(specs, self.signals, betas, strict=True)
        ]
        # Optional hook (row, record) -> bool, asked after each decision step is recorded:
        # True masks every deciding token so the row goes on undecided (judge_sweep uses it
        # to record the path that settings which stay undecided here would take).
        self.explore: Callable[[int, DecisionRecord], bool] | None = None
        self._prompt_len: int | None = None
        self._cache: dict[tuple[int, bytes, int], int] = {}
        self._quotes: torch.Tensor | None = None

    # -- classification ---------------------------------------------------------------
    def _quote_tokens(self, width: int, device: Any = "cpu") -> torch.Tensor:
        """Boolean mask over the logits' width: tokens whose bytes contain a double quote."""
        if (
            self._quotes is None
            or self._quotes.shape[0] != width
            or self._quotes.device != torch.device(device)
        ):
            quotes = torch.zeros(width, dtype=torch.bool, device=device)
            hits = [t for t, b in enumerate(self.token_bytes[:width]) if b'"' in b]
            quotes[hits] = True
            self._quotes = quotes
        return self._quotes

    def _live(self, row: int, text: bytes) -> list[int]:
        """Branches ``text`` is still consistent with (all while outside the region)."""
        return live_branches(self._markers[row], self.specs[row].region_start, text)

    def _classify(self, row: int, text: bytes, token: int, live: list[int]) -> int:
        """-1 undecided, -2 partial (several but not all live branches), else branch index."""
        key = (id(self.specs[row]), bytes(text), token)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        after = self._live(row, text + self.token_bytes[token])
        after = [i for i in after if i in live]
        if len(after) == len(live) or not after:
            cls = -1
        elif len(after) == 1:
            cls = after[0]
        else:
            cls = -2
        if len(self._cache) > 200_000:
            self._cache.clear()
        self._cache[key] = cls
        return cls

    def committed(self, row: int) -> bool:
        return len(self._live(row, bytes(self.generated[row]))) <= 1

    def commits_with(self, row: int, token: int) -> bool:
        """Whether row ``row`` is committed to a branch once ``token`` follows its text (a
        stopping criterion for read-outs through ``generate()``)."""
        return len(self._live(row, bytes(self.generated[row]) + self.token_bytes[token])) <= 1

    def accept(self, row: int, token: int) -> None:
        """Advance row ``row`` by ``token`` (for engines that do not pass input_ids)."""
        was_open = not self.committed(row)
        self.generated[row] += self.token_bytes[token]
        self.n_generated[row] += 1
        if was_open:
            live = self._live(row, bytes(self.generated[row]))
            if len(live) == 1:
                self.records[row].chosen = self.specs[row].names[live[0]]

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if scores.shape[0] != len(self.specs):
            raise ValueError(f"scores has {scores.shape[0]} rows, processor {len(self.specs)}")
        if self._prompt_len is None:
            self._prompt_len = input_ids.shape[1]
        else:
            for row, tok in enumerate(input_ids[:, -1].tolist()):
                self.accept(row, int(tok))
        self.apply(scores)
        return scores

    def apply(
        self,
        scores: torch.Tensor,
        rows: Sequence[int] | None = None,
        columns: torch.Tensor | None = None,
    ) -> None:
        """Block or bias each undecided row of ``scores`` in place (``rows`` and ``columns``
        as in ``GrammarLogitsProcessor.mask``: with ``columns``, only those ids are read)."""
        rows = list(range(len(self.specs))) if rows is None else list(rows)
        width = scores.shape[1]
        if columns is not None:
            columns = columns.to(scores.device)
        for i, row in enumerate(rows):
            text = bytes(self.generated[row])
            live = self._live(row, text)
            if len(live) <= 1:
                continue
            sc = scores[i] if columns is None else scores[i, columns]
            allowed = finite = torch.isfinite(sc)
            n_allowed = int(finite.sum())
            gate = self.specs[row].quote_gate
            if gate is not None and self.specs[row].region_start(text) is None and gate(text):
                quote = self._quote_tokens(width, finite.device)  # text
                finite = finite & (quote if columns is None else quote[columns])
            at = finite.nonzero().flatten()
            ids = (at if columns is None else columns[at]).tolist()
            groups: dict[int, list[int]] = {}
            for t in ids:
                cls = self._classify(row, text, t, live)
                if cls >= 0:
                    groups.setdefault(cls, []).append(t)
            if not groups:
                continue
            rec = self.records[row]
            if len(groups) < len(live):
                undecided_left = n_allowed > sum(len(g) for g in groups.values())
                if self.block_one_sided and undecided_left:
                    for toks in groups.values():
                        scores[i, toks] = NEG_INF
                    rec.blocked_steps += 1
                continue
            # The decision step: every live branch has a deciding token.
            idx = [torch.tensor(groups[b], device=scores.device) for b in live]
            lse = np.array([torch.logsumexp(scores[i, ix].double(), 0).item() for ix in idx])
            rest = torch.where(allowed, sc, NEG_INF)
            branch = torch.cat(idx)
            if columns is not None:  # the branch tokens' places among the columns
                branch = torch.searchsorted(columns, branch)
            rest[branch] = NEG_INF
            other = float(rest.max())
            rec.steps.append(
                DecisionStep(
                    tuple(live),
                    tuple(lse.tolist()),
                    tuple(float(scores[i, ix].max()) for ix in idx),
                    other,
                )
            )
            if self.explore is not None and other > NEG_INF and self.explore(row, rec):
                for ix in idx:
                    scores[i, ix] = NEG_INF
                rec.decision_steps += 1
                continue
            p = np.exp(lse - lse.max())
            p /= p.sum()
            signal = self.signals[row][live]
            deltas, entropy = branch_deltas(p, signal, self.betas[row], self.adaptive)
            q = np.exp(lse + deltas - (lse + deltas).max())
            q /= q.sum()
            for ix, d in zip(idx, deltas, strict=True):
                if d != 0.0:
                    scores[i, ix] += float(d)
            full = len(self.specs[row].names)
            rec.p_before = _expand(p, live, full)
            rec.p_after = _expand(q, live, full)
            rec.delta = _expand(deltas, live, full)
            rec.entropy = entropy
            rec.step = self.n_generated[row]
            rec.decision_steps += 1


@dataclass(frozen=True)
class Replayed:
    """A greedy decision re-decided under another bias (see ``replay_greedy``).

    ``branch`` is None when the replay cannot tell: the bias would have kept the row
    undecided where the recorded run committed, so the rest of its text is unknown.
    """

    branch: str | None
    step: int  # index into the record's steps where the row commits
    p_before: tuple[float, ...] = ()
    p_after: tuple[float, ...] = ()
    delta: tuple[float, ...] = ()
    entropy: float = 0.0


def replay_greedy(
    rec: DecisionRecord, signal: Sequence[float], beta: float, adaptive: bool
) -> Replayed:
    """Re-decide a greedy row from its unbiased record under bias ``(signal, beta, adaptive)``.

    The bias only moves the scores of deciding tokens, by the same amount for every token of
    a branch, so at each recorded step greedy commits to branch ``b`` iff
    ``top_b + delta_b`` beats every other branch and ``other`` (ties resolve as in the
    engine only up to rounding). While the undecided token wins, the row takes the same
    token as the recorded run and reaches its next recorded step. ``rec`` may come from any
    greedy run (its steps hold the scores before its own bias).
    """
    if not rec.steps:
        # No step offered every branch: the grammar alone decided (e.g. nothing to cite).
        return Replayed(rec.chosen, -1)
    names = rec.branches
    sig = np.asarray(signal, dtype=float)
    for k, st in enumerate(rec.steps):
        live = list(st.live)
        lse = np.asarray(st.lse)
        p = np.exp(lse - lse.max())
        p /= p.sum()
        deltas, entropy = branch_deltas(p, sig[live], beta, adaptive)
        # float32, as the engine adds the bias to float32 scores
        biased = np.asarray(st.top, dtype=np.float32) + deltas.astype(np.float32)
        best = int(np.argmax(biased))
        if biased[best] > np.float32(st.other):
            q = np.exp(lse + deltas - (lse + deltas).max())
            q /= q.sum()
            k_all = len(names)
            return Replayed(
                names[live[best]],
                k,
                _expand(p, live, k_all),
                _expand(q, live, k_all),
                _expand(deltas, live, k_all),
                entropy,
            )
        if k == len(rec.steps) - 1:
            # The recorded run committed here (or stopped): under this bias it would not have.
            return Replayed(None, k)
    return Replayed(None, len(rec.steps) - 1)


def _expand(values: np.ndarray, live: list[int], k: int) -> tuple[float, ...]:
    out = [0.0] * k
    for i, v in zip(live, values, strict=True):
        out[i] = float(v)
    return tuple(out)
