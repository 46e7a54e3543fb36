"""NRMS (Wu et al., EMNLP 2019) over item titles, as the RecSys Arena paper ran it on MovieLens.

Title encoder: word embeddings -> multi-head self-attention -> additive attention -> the
title vector. User encoder: multi-head self-attention over the history's title vectors ->
additive attention -> the user vector. Score: their dot product. Training as the paper:
each training interaction is a (history, positive) example against ``negatives`` items drawn
uniformly, a (K+1)-way softmax. The history of an example is the user's items before it
(the most recent ``max_history``), so training and scoring see the same kind of input.

Adapted: word embeddings are learned from the titles (the paper initialises them with GloVe,
which is not available offline here); the title tokenizer is lower-cased words and numbers.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from recjudge.cf_models._base import MODELS, CFModel, SideInfo, TrainOptions
from recjudge.cf_models._features import FeatureError
from recjudge.cf_models._torch_loop import fit_epochs

_WORD = re.compile(r"[^\W_]+", re.UNICODE)


def title_words(title: Any) -> list[str]:
    """Lower-cased word and number tokens of a title (``"Heat (1995)" -> [heat, 1995]``)."""
    if title is None or (not isinstance(title, str) and pd.isna(title)):
        return []
    return _WORD.findall(str(title).lower())


class NRMSConfig(BaseModel):
    """NRMS settings (the paper's heads and query size, smaller embeddings for a CPU).

    Attributes:
        dim: word and title vector size (heads x head size). heads: attention heads.
        query: additive-attention query size. title_words: words kept per title.
        max_history: most recent history items the user encoder reads.
        negatives: K sampled negatives per positive. dropout: on embeddings and encoder
            outputs.
        examples_per_user: per epoch, this many of a user's interactions (drawn anew each
            epoch) are training examples; None: every interaction every epoch.
        lr, batch, epochs: Adam training.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    dim: int = Field(64, ge=1)
    heads: int = Field(4, ge=1)
    query: int = Field(32, ge=1)
    title_words: int = Field(16, ge=1)
    max_history: int = Field(50, ge=1)
    negatives: int = Field(4, ge=1)
    dropout: float = Field(0.2, ge=0, lt=1)
    examples_per_user: int | None = Field(20, ge=1)
    lr: float = Field(1e-3, gt=0)
    batch: int = Field(1024, ge=1)
    epochs: int = Field(8, ge=1)
    title_column: str = "title"


def _build_net(vocab: int, c: NRMSConfig):
    import torch
    from torch import nn

    class Additive(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(c.dim, c.query)
            self.q = nn.Linear(c.query, 1, bias=False)

        def forward(self, x, pad):  # x [B, L, d], pad [B, L] True = padding
            a = self.q(torch.tanh(self.proj(x))).squeeze(-1).masked_fill(pad, -1e9)
            return (torch.softmax(a, -1).unsqueeze(-1) * x).sum(1)

    class Encoder(nn.Module):
        """Self-attention then additive attention over a padded sequence of vectors."""

        def __init__(self) -> None:
            super().__init__()
            # Dropout on inputs and outputs as the reference code, not on attention weights
            # (on a CPU, sampling those masks cost a third of the training time).
            self.attn = nn.MultiheadAttention(c.dim, c.heads, 0.0, batch_first=True)
            self.drop = nn.Dropout(c.dropout)
            self.pool = Additive()

        def forward(self, x, pad):
            pad = pad.clone()
            empty = pad.all(-1)
            pad[empty, 0] = False  # an all-padding row attends to one zero vector, not NaN
            h, _ = self.attn(x, x, x, key_padding_mask=pad, need_weights=False)
            return self.pool(self.drop(h), pad) * (~empty).unsqueeze(-1)

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.words = nn.Embedding(vocab, c.dim, padding_idx=0)
            self.drop = nn.Dropout(c.dropout)
            self.title = Encoder()
            self.user = Encoder()

        def titles(self, tokens):  # [N, W] -> [N, d]
            return self.title(self.drop(self.words(tokens)), tokens == 0)

        def users(self, vectors, pad):  # [B, L, d], [B, L] -> [B, d]
            return self.user(vectors, pad)

    return Net()


@MODELS.decorator("nrms")
class NRMS(CFModel):
    """Neural recommendation with multi-head self-attention over titles (module docstring)."""

    name = "nrms"
    Config = NRMSConfig
    uses_torch = True
    uses_side_info = True

    def __init__(self, config: NRMSConfig | None = None) -> None:
        super().__init__(config)
        self.net = None
        self.vocab: list[str] = []
        self.tokens: np.ndarray | None = None  # [n_items, title_words], 0 = padding
        self._title_cache = None

    def _set_side_info(self, side: SideInfo) -> None:
        c: NRMSConfig = self.config
        if c.title_column not in side.items.columns:
            raise FeatureError(
                f"{side.source}: the items table has no {c.title_column!r} column (it has "
                f"{sorted(map(str, side.items.columns))}). Fix: import items with a title "
                "column, or set the config's title_column"
            )
        titles = side.items.assign(_k=side.items["item_id"].astype(str)).drop_duplicates("_k")
        by_id = dict(zip(titles["_k"], titles[c.title_column], strict=True))
        words = [title_words(by_id.get(i))[: c.title_words] for i in self.items]
        counts = Counter(w for ws in words for w in ws)
        self.vocab = sorted(counts)
        self.tokens = self._encode_titles(words)

    def _encode_titles(self, words: list[list[str]]) -> np.ndarray:
        index = {w: k + 1 for k, w in enumerate(self.vocab)}
        rows = [[index[w] for w in ws if w in index][: self.config.title_words] for ws in words]
        width = max([len(r) for r in rows] + [1])  # short titles: no columns of padding only
        out = np.zeros((len(words), width), dtype=np.int64)
        for r, ids in enumerate(rows):
            out[r, : len(ids)] = ids
        return out

    # -- training -------------------------------------------------------------------------
    def _fit(self, df: pd.DataFrame, options: TrainOptions) -> None:
        c: NRMSConfig = self.config
        self.net = _build_net(len(self.vocab) + 1, c)
        seqs = (
            df.assign(ix=df["item_id"].astype(str).map(self.item_index))
            .groupby("user_id", sort=False)["ix"]
            .apply(lambda s: s.to_numpy(np.int64))
            .tolist()
        )
        examples = np.array(
            [(u, t) for u, s in enumerate(seqs) for t in range(1, len(s))], dtype=np.int64
        ).reshape(-1, 2)

        def batches(rng: np.random.Generator) -> Iterator[Any]:
            yield from self._epoch(rng, seqs, examples)

        self.net.train()
        fit_epochs(
            self.name, self.net.parameters(), c.epochs, c.lr, batches, options.seed,
            options.progress, self.train_info,
        )  # fmt: skip
        self.net.eval()
        self._title_cache = None

    def _histories(self, seqs, rows) -> np.ndarray:
        """``[B, max_history]`` item indices + 1 (0 = padding), left-padded."""
        length = self.config.max_history
        out = np.zeros((len(rows), length), dtype=np.int64)
        for r, (u, t) in enumerate(rows):
            h = seqs[u][max(0, t - length) : t]
            if len(h):
                out[r, length - len(h) :] = h + 1
        return out

    def _epoch(self, rng, seqs, examples) -> Iterator[Any]:
        import torch

        c: NRMSConfig = self.config
        order = rng.permutation(len(examples))
        if c.examples_per_user is not None:  # the first k of each user in a random order
            users = examples[order, 0]
            rank = pd.Series(users).groupby(users).cumcount().to_numpy()
            order = order[rank < c.examples_per_user]
        for b in range(0, len(order), c.batch):
            rows = examples[order[b : b + c.batch]]
            hist = self._histories(seqs, rows)
            pos = np.array([seqs[u][t] for u, t in rows], dtype=np.int64)
            neg = rng.integers(0, len(self.items), size=(len(rows), c.negatives))
            cand = np.concatenate([pos[:, None], neg], 1)
            # Encode each distinct title of the batch once.
            needed = np.unique(np.concatenate([hist[hist > 0] - 1, cand.ravel()]))
            vec = self.net.titles(torch.from_numpy(self.tokens[needed]))
            where = np.zeros(len(self.items) + 1, dtype=np.int64)
            where[needed + 1] = np.arange(1, len(needed) + 1)
            table = torch.cat([torch.zeros(1, vec.shape[1]), vec])
            hv = table[torch.from_numpy(where[hist])]
            user = self.net.users(hv, torch.from_numpy(hist == 0))
            logits = torch.einsum("bd,bkd->bk", user, table[torch.from_numpy(where[cand + 1])])
            # A negative equal to the positive is not a negative.
            same = np.c_[np.zeros(len(rows), bool), neg == pos[:, None]]
            logits = logits.masked_fill(torch.from_numpy(same), -1e9)
            target = torch.zeros(len(rows), dtype=torch.long)  # the positive is class 0
            yield torch.nn.functional.cross_entropy(logits, target)

    # -- scoring --------------------------------------------------------------------------
    def _titles(self):
        if self._title_cache is None:
            import torch

            with torch.inference_mode():
                self._title_cache = torch.cat(
                    [
                        self.net.titles(torch.from_numpy(self.tokens[b : b + 4096]))
                        for b in range(0, len(self.tokens), 4096)
                    ]  # fmt: skip
                )
        return self._title_cache

    def score_history(self, history, user_id=None):
        return self.score_many([history])[0]

    def score_many(self, histories, user_ids=None):
        import torch

        titles = self._titles()
        table = torch.cat([torch.zeros(1, titles.shape[1]), titles])
        out = []
        for b in range(0, len(histories), 512):
            seqs = [np.asarray(self.encode(h), dtype=np.int64) for h in histories[b : b + 512]]
            rows = [(k, len(s)) for k, s in enumerate(seqs)]
            hist = self._histories(seqs, rows)
            with torch.inference_mode():
                user = self.net.users(table[torch.from_numpy(hist)], torch.from_numpy(hist == 0))
                out.append((user @ titles.T).numpy())
        return np.concatenate(out) if out else np.zeros((0, len(self.items)), np.float32)

    def item_embeddings(self) -> np.ndarray:
        return self._titles().numpy()

    # -- persistence ----------------------------------------------------------------------
    def _meta(self) -> dict[str, Any]:
        return {"vocab": self.vocab}

    def _restore_meta(self, meta: dict[str, Any]) -> None:
        self.vocab = list(meta.get("vocab", []))

    def _tensors(self):
        t = {f"net.{k}": v.detach().numpy() for k, v in self.net.state_dict().items()}
        t["tokens"] = self.tokens
        return t

    def _restore(self, t):
        import torch

        self.tokens = t["tokens"]
        self.net = _build_net(len(self.vocab) + 1, self.config)
        self.net.load_state_dict(
            {k[4:]: torch.from_numpy(v) for k, v in t.items() if k.startswith("net.")}
        )
        self.net.eval()
        self._title_cache = None
