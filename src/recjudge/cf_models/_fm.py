"""Factorisation machine (Rendle, ICDM 2010) and DeepFM (Guo et al., IJCAI 2017) over
user attributes, the user's history, the item id and item attributes.

Features (one *field* per attribute):
    user side: ``user_fields`` (ML-1M: gender, age, occupation) and the history as a
    normalised bag of items (Rendle's implicit-feedback encoding, as in SVD++-style FMs);
    item side: the item id and ``item_fields`` (ML-1M: genres, year).
A field's value is a bag ``x_j = 1/|bag|`` over its distinct active features (one feature
for gender, several for genres or the history). The user is described by attributes and
history, never by a learned per-user vector, so a score is always from the request's history.

FM:  ``y = b + sum_j w_j x_j + 1/2 (|sum_j x_j v_j|^2 - sum_j x_j^2 |v_j|^2)``, which splits
into a user-side part, an item-side part and ``<S_user, S_item>`` (S = sum of x_j v_j on that
side), so all items are scored with one matrix product.
DeepFM: the same FM plus an MLP over the concatenated field embeddings ``e_f = sum_j x_j v_j``
(shared embeddings, as the paper); the MLP's first layer splits into user and item halves.

Training: binary cross-entropy on each training interaction against ``negatives`` items
drawn uniformly (a draw equal to the positive is not counted); the positive is removed from
the history bag of its own example, so the model never sees the answer among its inputs.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from recjudge.cf_models._base import MODELS, CFModel, SideInfo, TrainOptions
from recjudge.cf_models._features import (
    field_table,
    fields_from_meta,
    fields_meta,
    fit_fields,
)
from recjudge.cf_models._torch_loop import fit_epochs


class FMConfig(BaseModel):
    """FM settings (ML-1M defaults).

    Attributes:
        dim: embedding size k.
        user_fields / item_fields: attribute columns of the users / items table.
        history: include the history bag as a user-side field.
        max_history: most recent history items in the bag.
        negatives: sampled negatives per positive.
        lr, weight_decay, batch, epochs: Adam training.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    dim: int = Field(32, ge=1)
    user_fields: tuple[str, ...] = ("gender", "age", "occupation")
    item_fields: tuple[str, ...] = ("genres", "year")
    history: bool = True
    max_history: int = Field(50, ge=1)
    negatives: int = Field(4, ge=1)
    lr: float = Field(1e-3, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    batch: int = Field(2048, ge=1)
    epochs: int = Field(10, ge=1)


class DeepFMConfig(FMConfig):
    """DeepFM settings: FM's plus the MLP.

    Attributes:
        hidden: MLP layer sizes. dropout: on the MLP's hidden layers.
    """

    hidden: tuple[int, ...] = (128, 64)
    dropout: float = Field(0.2, ge=0, lt=1)


class DeepFMNoUserConfig(DeepFMConfig):
    """DeepFM without user attributes (the arena paper's transparency test, §4.2.2)."""

    user_fields: tuple[str, ...] = ()


def _field_bags(embs: Any, lins: Any, idx: list[Any]) -> tuple[Any, Any, Any]:
    """(S, constant, first-layer input) of one side from per-field index tensors.

    Index tensors may be ``[B, w]`` or ``[B, n, w]``; each field is a weighted bag
    (``embedding_bag``, whose backward is far cheaper than a gather's)."""
    import torch
    from torch.nn import functional as F

    total, const, fields = None, 0.0, []
    for emb, lin, ix in zip(embs, lins, idx, strict=True):
        lead, w = ix.shape[:-1], ix.shape[-1]
        flat = ix.reshape(-1, w)
        mask = (flat > 0).float()
        count = mask.sum(-1, keepdim=True).clamp(min=1.0)
        # x_j = 1/n on a bag of n, so sum x_j^2 |v_j|^2 = (1/n) sum x_j |v_j|^2: one
        # bag over [v | w | |v|^2] gives the embedding, linear and square terms.
        table = torch.cat([emb.weight, lin.weight, emb.weight.pow(2).sum(-1, True)], 1)
        bag = F.embedding_bag(flat, table, per_sample_weights=mask / count, mode="sum")
        e, lw, q = bag[:, :-2], bag[:, -2], bag[:, -1] / count.squeeze(-1)
        e = e.reshape(*lead, -1)
        const = const + (lw - 0.5 * q).reshape(lead)
        total = e if total is None else total + e
        fields.append(e)
    if total is None:
        return None, 0.0, None
    const = const + 0.5 * (total * total).sum(-1)
    return total, const, torch.cat(fields, -1)


def _build_net(sizes_user: list[int], sizes_item: list[int], c: FMConfig, deep: bool):
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.user_emb = nn.ModuleList(nn.Embedding(n, c.dim, padding_idx=0) for n in sizes_user)
            self.user_lin = nn.ModuleList(nn.Embedding(n, 1, padding_idx=0) for n in sizes_user)
            self.item_emb = nn.ModuleList(nn.Embedding(n, c.dim, padding_idx=0) for n in sizes_item)
            self.item_lin = nn.ModuleList(nn.Embedding(n, 1, padding_idx=0) for n in sizes_item)
            self.bias = nn.Parameter(torch.zeros(()))
            for e in [*self.user_emb, *self.item_emb]:
                nn.init.normal_(e.weight, std=0.01)
            for e in [*self.user_lin, *self.item_lin]:
                nn.init.zeros_(e.weight)
            if deep:
                h = list(getattr(c, "hidden", ()))
                nu, ni = len(sizes_user), len(sizes_item)
                self.first_user = nn.Linear(nu * c.dim, h[0], bias=False) if nu else None
                self.first_item = nn.Linear(ni * c.dim, h[0])
                layers: list[nn.Module] = [nn.ReLU(), nn.Dropout(c.dropout)]
                for a, b in zip(h, h[1:], strict=False):
                    layers += [nn.Linear(a, b), nn.ReLU(), nn.Dropout(c.dropout)]
                layers.append(nn.Linear(h[-1], 1))
                self.mlp = nn.Sequential(*layers)
            self.deep = deep

        side = staticmethod(_field_bags)

        def users(self, idx):
            return self.side(self.user_emb, self.user_lin, idx)

        def items(self, idx):
            return self.side(self.item_emb, self.item_lin, idx)

        def pre_user(self, fu):
            return self.first_user(fu) if self.deep and self.first_user is not None else 0.0

        def pre_item(self, fi):
            return self.first_item(fi) if self.deep else 0.0

        def combine(self, su, cu, pu, si, ci, pi):
            """Scores ``[B, n]`` of users ``[B, ...]`` against items ``[B, n, ...]`` or
            ``[n, ...]`` (shared by every user)."""
            shared = si.dim() == 2
            dot = su @ si.T if shared else torch.einsum("bd,bnd->bn", su, si)
            y = self.bias + dot + ci + (cu.unsqueeze(-1) if torch.is_tensor(cu) else cu)
            if self.deep:
                pre_u = pu.unsqueeze(-2) if torch.is_tensor(pu) else pu
                pre = pi.unsqueeze(0) + pre_u if shared else pi + pre_u
                y = y + self.mlp(pre).squeeze(-1)
            return y

    return Net()


class _FieldModel(CFModel):
    """Shared by FM and DeepFM: field tables, training loop, scoring, persistence."""

    uses_torch = True
    uses_side_info = True
    deep = False

    def __init__(self, config: FMConfig | None = None) -> None:
        super().__init__(config)
        self.net = None
        self._user_fields: list[Any] = []
        self._item_fields: list[Any] = []
        self._user_tables: list[np.ndarray] = []
        self._item_tables: list[np.ndarray] = []
        self._feature_users: dict[str, int] = {}
        self._cache: Any = None  # item-side terms of every item, computed once after training

    # -- features -------------------------------------------------------------------------
    def _set_side_info(self, side: SideInfo) -> None:
        c: FMConfig = self.config
        self._user_fields = fit_fields(side.users, c.user_fields, "users", side.source)
        self._item_fields = fit_fields(side.items, c.item_fields, "items", side.source)
        if self._user_fields:
            ids = side.users["user_id"].astype(str).drop_duplicates().tolist()
            self._feature_users = {u: i for i, u in enumerate(ids)}
            self._user_tables = field_table(side.users, "user_id", ids, self._user_fields)
        self._item_tables = field_table(side.items, "item_id", self.items, self._item_fields)
        # An item of the catalogue with no row in the items table has unknown attributes.

    def _sizes(self) -> tuple[list[int], list[int]]:
        n = len(self.items) + 1
        user = [f.size for f in self._user_fields] + ([n] if self.config.history else [])
        item = [n] + [f.size for f in self._item_fields]
        return user, item

    def _user_index(self, histories: Sequence[Sequence[int]], user_ids: Sequence[str | None]):
        """Per user-side field, ``[B, w]`` index tensors (history: the last ``max_history``)."""
        import torch

        out = []
        rows = np.array([self._feature_users.get(str(u), -1) for u in user_ids], dtype=np.int64)
        for table in self._user_tables:
            got = table[np.maximum(rows, 0)]
            got[rows < 0] = 0  # a user with no attribute row: attributes unknown
            out.append(torch.from_numpy(got))
        if self.config.history:
            length = self.config.max_history
            arr = np.zeros((len(histories), length), dtype=np.int64)
            for r, h in enumerate(histories):
                # The bag is a set (Rendle's x_j = 1/|bag| per distinct item): the most
                # recent ``max_history`` distinct items.
                h = list(dict.fromkeys(reversed(list(h))))[:length][::-1]
                if h:
                    arr[r, : len(h)] = np.asarray(h) + 1
            out.append(torch.from_numpy(arr))
        return out

    def _item_index(self, items: np.ndarray):
        """Per item-side field, index tensors shaped ``items.shape + (w,)``."""
        import torch

        out = [torch.from_numpy((items + 1)[..., None])]
        for table in self._item_tables:
            out.append(torch.from_numpy(table[items]))
        return out

    # -- training -------------------------------------------------------------------------
    def _fit(self, df: pd.DataFrame, options: TrainOptions) -> None:
        c: FMConfig = self.config
        sizes_user, sizes_item = self._sizes()
        if not sizes_user:
            raise ValueError(
                f"{self.name}: no user-side field (user_fields is empty and history is off); "
                "the model could not tell users apart. Set history: true or user_fields"
            )
        self.net = _build_net(sizes_user, sizes_item, c, self.deep)
        users = df["user_id"].astype(str).to_numpy()
        items = df["item_id"].astype(str).map(self.item_index).to_numpy(dtype=np.int64)
        seqs: dict[str, list[int]] = {}
        for u, i in zip(users, items, strict=True):
            seqs.setdefault(u, []).append(int(i))
        user_list = list(seqs)
        hist = self._user_index([seqs[u] for u in user_list], user_list)
        row_of = {u: r for r, u in enumerate(user_list)}
        rows = np.array([row_of[u] for u in users], dtype=np.int64)

        def batches(rng: np.random.Generator) -> Iterator[Any]:
            yield from self._epoch(rng, rows, items, hist)

        self.net.train()
        fit_epochs(
            self.name, self.net.parameters(), c.epochs, c.lr, batches, options.seed,
            options.progress, self.train_info, c.weight_decay,
        )  # fmt: skip
        self.net.eval()
        self._cache = None

    def _epoch(self, rng, rows, items, hist) -> Iterator[Any]:
        import torch

        c: FMConfig = self.config
        n = len(self.items)
        order = rng.permutation(len(rows))
        for b in range(0, len(order), c.batch):
            ix = order[b : b + c.batch]
            r, pos = torch.from_numpy(rows[ix]), items[ix]
            uidx = [t[r] for t in hist]
            if c.history:  # the positive is not an input of its own example
                uidx[-1] = torch.where(uidx[-1] == torch.from_numpy(pos + 1)[:, None], 0, uidx[-1])
            neg = rng.integers(0, n, size=(len(ix), c.negatives))
            cand = np.concatenate([pos[:, None], neg], 1)
            su, cu, fu = self.net.users(uidx)
            si, ci, fi = self.net.items(self._item_index(cand))
            logits = self.net.combine(su, cu, self.net.pre_user(fu), si, ci, self.net.pre_item(fi))
            labels = torch.zeros_like(logits)
            labels[:, 0] = 1.0
            weight = torch.from_numpy(np.concatenate(
                [np.ones((len(ix), 1)), (neg != pos[:, None])], 1
            ).astype(np.float32))  # fmt: skip
            loss = (
                torch.nn.functional.binary_cross_entropy_with_logits(
                    logits, labels, weight=weight, reduction="sum"
                )
                / weight.sum()
            )
            yield loss

    # -- scoring --------------------------------------------------------------------------
    def _all_items(self):
        if self._cache is None:
            import torch

            with torch.inference_mode():
                si, ci, fi = self.net.items(self._item_index(np.arange(len(self.items))))
                self._cache = (si, ci, self.net.pre_item(fi))
        return self._cache

    def score_history(self, history, user_id=None):
        return self.score_many([history], [user_id])[0]

    def score_many(self, histories, user_ids=None):
        import torch

        user_ids = list(user_ids) if user_ids is not None else [None] * len(histories)
        si, ci, pi = self._all_items()
        out = []
        step = 64 if self.deep else 512
        for b in range(0, len(histories), step):
            enc = [self.encode(h) for h in histories[b : b + step]]
            uidx = self._user_index(enc, user_ids[b : b + step])
            with torch.inference_mode():
                su, cu, fu = self.net.users(uidx)
                if su is None:  # no user-side field at all: every user scores alike
                    su = torch.zeros(len(enc), si.shape[-1])
                y = self.net.combine(su, cu, self.net.pre_user(fu), si, ci, pi)
            out.append(y.numpy().astype(np.float32))
        return np.concatenate(out) if out else np.zeros((0, len(self.items)), np.float32)

    def item_embeddings(self) -> np.ndarray:
        return self.net.item_emb[0].weight[1:].detach().numpy()

    # -- persistence ----------------------------------------------------------------------
    def _meta(self) -> dict[str, Any]:
        return {
            "user_fields": fields_meta(self._user_fields),
            "item_fields": fields_meta(self._item_fields),
            "feature_users": list(self._feature_users),
        }

    def _restore_meta(self, meta: dict[str, Any]) -> None:
        self._user_fields = fields_from_meta(meta.get("user_fields", []))
        self._item_fields = fields_from_meta(meta.get("item_fields", []))
        self._feature_users = {u: i for i, u in enumerate(meta.get("feature_users", []))}

    def _tensors(self):
        t = {f"net.{k}": v.detach().numpy() for k, v in self.net.state_dict().items()}
        for f, tab in zip(self._user_fields, self._user_tables, strict=True):
            t[f"user_table.{f.name}"] = tab
        for f, tab in zip(self._item_fields, self._item_tables, strict=True):
            t[f"item_table.{f.name}"] = tab
        return t

    def _restore(self, t):
        import torch

        self._user_tables = [t[f"user_table.{f.name}"] for f in self._user_fields]
        self._item_tables = [t[f"item_table.{f.name}"] for f in self._item_fields]
        sizes_user, sizes_item = self._sizes()
        self.net = _build_net(sizes_user, sizes_item, self.config, self.deep)
        state = {k[4:]: torch.from_numpy(v) for k, v in t.items() if k.startswith("net.")}
        self.net.load_state_dict(state)
        self.net.eval()
        self._cache = None


@MODELS.decorator("fm")
class FM(_FieldModel):
    """Rendle's factorisation machine over user attributes, history, item id and item
    attributes (see the module docstring for the features and the loss)."""

    name = "fm"
    Config = FMConfig


@MODELS.decorator("deepfm")
class DeepFM(_FieldModel):
    """DeepFM: the FM plus an MLP over the field embeddings (shared embeddings)."""

    name = "deepfm"
    Config = DeepFMConfig
    deep = True


@MODELS.decorator("deepfm-nouser")
class DeepFMNoUser(DeepFM):
    """DeepFM without user attributes (history and item features only): the arena paper's
    transparency test compares it with ``deepfm``."""

    name = "deepfm-nouser"
    Config = DeepFMNoUserConfig
