"""LightGCN (He et al., SIGIR 2020) in PyTorch, with users defined by their items.

Propagation as the paper: on the user-item graph with symmetric normalisation,
``e_u^(k+1) = sum_{i in N(u)} e_i^(k) / sqrt(|N(u)| |N(i)|)`` (and the same for items), the
final embedding is the mean of layers 0..K, the score is ``<e_u, e_i>``, trained with BPR and
L2 on the layer-0 embeddings of the batch.

One deviation, for inductive use: the paper learns a free layer-0 vector per user, which
exists only for the training history of a training user. Here a user's layer-0 vector is the
mean of their items' layer-0 vectors (``e_u^(0) = mean_{i in N(u)} e_i^(0)``), during training
and at scoring time alike, so any history (a new user, or a known user at another time) is
scored exactly as training would: its layers are computed from the history's items with
the items' trained layers and degrees. No score ever uses a training row the request lacks.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from recjudge.cf_models._base import MODELS, CFModel, TrainOptions
from recjudge.cf_models._torch_loop import fit_epochs


class LightGCNConfig(BaseModel):
    """LightGCN settings (the paper's: d 64, 3 layers, Adam 1e-3, L2 1e-4).

    Attributes:
        dim: embedding size. layers: propagation layers K.
        lr, l2, batch, epochs: BPR training (one epoch = every training edge once).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    dim: int = Field(64, ge=1)
    layers: int = Field(3, ge=1)
    lr: float = Field(1e-3, gt=0)
    l2: float = Field(1e-4, ge=0)
    batch: int = Field(4096, ge=1)
    epochs: int = Field(30, ge=1)


def _csr(edges: np.ndarray, values: np.ndarray, shape: tuple[int, int]):
    import torch

    coo = torch.sparse_coo_tensor(
        torch.from_numpy(np.ascontiguousarray(edges)),
        torch.from_numpy(values.astype(np.float32)),
        shape,
        check_invariants=True,
    )
    with warnings.catch_warnings():
        # torch flags every CSR tensor "beta"; LightGCN only multiplies it by dense
        # matrices (a stable path), so the warning would only alarm users training it
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        return coo.coalesce().to_sparse_csr()


@functools.cache
def _spmm():
    """``A @ x`` for a fixed sparse ``A`` whose transpose is given: the backward is one more
    sparse product (torch's own backward transposes a COO matrix every step). Built on first
    use, so importing the module does not import torch."""
    import torch

    class SpMM(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, a_t, x):
            ctx.a_t = a_t
            return a @ x

        @staticmethod
        def backward(ctx, grad):
            return None, None, ctx.a_t @ grad

    return SpMM


@MODELS.decorator("lightgcn")
class LightGCN(CFModel):
    """Light graph convolution over the user-item graph (see the module docstring)."""

    name = "lightgcn"
    Config = LightGCNConfig
    uses_torch = True

    def __init__(self, config: LightGCNConfig | None = None) -> None:
        super().__init__(config)
        self.item_layers: np.ndarray | None = None  # [K+1, n, d]
        self.degree: np.ndarray | None = None  # training users per item

    # -- training -------------------------------------------------------------------------
    def _fit(self, df: pd.DataFrame, options: TrainOptions) -> None:
        import torch

        c: LightGCNConfig = self.config
        n = len(self.items)
        pairs = pd.DataFrame(
            {
                "u": df["user_id"].astype(str).map(self.user_index).to_numpy(),
                "i": df["item_id"].astype(str).map(self.item_index).to_numpy(),
            }
        ).drop_duplicates()
        u, i = pairs["u"].to_numpy(np.int64), pairs["i"].to_numpy(np.int64)
        n_users = len(self.user_index)
        du = np.bincount(u, minlength=n_users).astype(np.float32)
        di = np.bincount(i, minlength=n).astype(np.float32)
        self.degree = di
        edges = np.stack([u, i])
        sym = _csr(edges, 1.0 / np.sqrt(du[u] * di[i]), (n_users, n))
        sym_t = _csr(edges[::-1], 1.0 / np.sqrt(du[u] * di[i]), (n, n_users))
        mean = _csr(edges, 1.0 / du[u], (n_users, n))
        mean_t = _csr(edges[::-1], 1.0 / du[u], (n, n_users))
        graph = ((sym, sym_t), (sym_t, sym), (mean, mean_t))
        emb = torch.nn.Parameter(torch.empty(n, c.dim))
        torch.nn.init.normal_(emb, std=0.1)
        self._emb = emb

        def batches(rng: np.random.Generator) -> Iterator[Any]:
            yield from self._epoch(rng, u, i, graph)

        fit_epochs(
            self.name, [emb], c.epochs, c.lr, batches, options.seed, options.progress,
            self.train_info,
        )  # fmt: skip
        with torch.no_grad():
            _, items = self._propagate(graph)
        self.item_layers = torch.stack(items).detach().numpy()
        del self._emb

    def _propagate(self, graph):
        """Per-layer (users, items) embeddings, layer 0 first."""

        to_users, to_items, mean = graph
        users, items = [_spmm().apply(*mean, self._emb)], [self._emb]
        for _ in range(self.config.layers):
            nu = _spmm().apply(*to_users, items[-1])
            ni = _spmm().apply(*to_items, users[-1])
            users.append(nu)
            items.append(ni)
        return users, items

    def _epoch(self, rng, u, i, graph) -> Iterator[Any]:
        import torch

        c: LightGCNConfig = self.config
        order = rng.permutation(len(u))
        for b in range(0, len(order), c.batch):
            ix = order[b : b + c.batch]
            bu, bi = torch.from_numpy(u[ix]), torch.from_numpy(i[ix])
            bj = torch.from_numpy(rng.integers(0, len(self.items), size=len(ix)))
            users, items = self._propagate(graph)
            fu = torch.stack(users).mean(0)
            fi = torch.stack(items).mean(0)
            pos = (fu[bu] * fi[bi]).sum(-1)
            neg = (fu[bu] * fi[bj]).sum(-1)
            bpr = -torch.nn.functional.logsigmoid(pos - neg).mean()
            reg = (
                users[0][bu].pow(2).sum() + items[0][bi].pow(2).sum() + items[0][bj].pow(2).sum()
            ) / (2 * len(ix))
            yield bpr + c.l2 * reg

    # -- scoring --------------------------------------------------------------------------
    def _user_vectors(self, histories) -> np.ndarray:
        """Each history's final embedding, from its items' layers and training degrees."""
        layers, degree = self.item_layers, self.degree
        assert layers is not None and degree is not None
        out = np.zeros((len(histories), layers.shape[-1]), dtype=np.float32)
        for r, h in enumerate(histories):
            ix = np.unique(np.asarray(self.encode(h), dtype=np.int64))
            ix = ix[degree[ix] > 0]  # an item no training user had is not in the graph
            if not len(ix):
                continue
            norm = 1.0 / np.sqrt(len(ix) * degree[ix])
            vec = layers[0][ix].mean(0)
            for k in range(1, layers.shape[0]):
                vec = vec + norm @ layers[k - 1][ix]
            out[r] = vec / layers.shape[0]
        return out

    def score_history(self, history, user_id=None):
        return self.score_many([history])[0]

    def score_many(self, histories, user_ids=None):
        final = self.item_layers.mean(0)
        return (self._user_vectors(histories) @ final.T).astype(np.float32)

    def item_embeddings(self) -> np.ndarray:
        return self.item_layers.mean(0)

    # -- persistence ----------------------------------------------------------------------
    def _tensors(self):
        return {"item_layers": self.item_layers, "degree": self.degree}

    def _restore(self, t):
        self.item_layers, self.degree = t["item_layers"], t["degree"]
