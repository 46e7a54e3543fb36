"""Matrix factorisation (implicit ALS/BPR), ItemKNN, popularity and item-item similarity."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import scipy.sparse as sp
from pydantic import BaseModel, ConfigDict, Field
from threadpoolctl import threadpool_limits

from recjudge.cf_models._base import MODELS, CFModel, TrainOptions


def interaction_matrix(model: CFModel, df: pd.DataFrame) -> sp.csr_matrix:
    """Binary users x items CSR in the model's id order (duplicates collapse to 1)."""
    rows = df["user_id"].astype(str).map(model.user_index).to_numpy()
    cols = df["item_id"].astype(str).map(model.item_index)
    keep = cols.notna().to_numpy()
    m = sp.csr_matrix(
        (np.ones(keep.sum(), dtype=np.float32), (rows[keep], cols[keep].astype(int).to_numpy())),
        shape=(len(model.user_index), len(model.items)),
    )
    m.data[:] = 1.0
    return m


class MFConfig(BaseModel):
    """implicit ALS/BPR hyper-parameters."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    factors: int = Field(64, ge=1)
    regularization: float = Field(0.05, ge=0)
    iterations: int = Field(20, ge=1)
    alpha: float = Field(10.0, gt=0)  # ALS confidence scale
    learning_rate: float = Field(0.01, gt=0)  # BPR


class _MF(CFModel):
    Config = MFConfig

    def _make(self, options: TrainOptions):
        raise NotImplementedError

    def _fit(self, df: pd.DataFrame, options: TrainOptions) -> None:
        self._ui = interaction_matrix(self, df)
        # implicit parallelises itself; nested BLAS threads only contend. Its constructor
        # checks the BLAS pool too (and warns), so it is built inside the limit as well.
        # Its first import loads scipy's own OpenBLAS, which a limit entered before that load
        # does not cover: import it first.
        import implicit.cpu  # noqa: F401

        with threadpool_limits(1, "blas"):
            model = self._make(options)
            model.fit(self._ui, show_progress=options.progress)
        self.user_factors = np.asarray(model.user_factors, dtype=np.float32)
        self.item_factors = np.asarray(model.item_factors, dtype=np.float32)

    def _fold_in(self, idx: list[int]) -> np.ndarray:
        raise NotImplementedError

    def user_vector(self, history: Sequence[str], user_id: str | None) -> np.ndarray:
        """Always from ``history`` (``user_id`` is not used): a training user's stored
        vector would bring in training rows the request's history may not have (items after
        a cut, a held-out item), so every request is folded in from what it shows."""
        return self._fold_in(self.encode(history))

    def score_history(self, history: Sequence[str], user_id: str | None = None) -> np.ndarray:
        return self.item_factors @ self.user_vector(history, user_id)

    def score_many(self, histories, user_ids=None):
        user_ids = user_ids or [None] * len(histories)
        u = np.stack([self.user_vector(h, uid) for h, uid in zip(histories, user_ids, strict=True)])
        return u @ self.item_factors.T

    def item_embeddings(self) -> np.ndarray:
        return self.item_factors

    def _tensors(self):
        return {"user_factors": self.user_factors, "item_factors": self.item_factors}

    def _restore(self, t):
        self.user_factors, self.item_factors = t["user_factors"], t["item_factors"]


@MODELS.decorator("als")
class ALS(_MF):
    """Implicit-feedback ALS (Hu, Koren & Volinsky 2008) via ``implicit``; unseen users are
    folded in by solving their least-squares problem against the fixed item factors."""

    name = "als"

    def _make(self, options: TrainOptions):
        from implicit.cpu.als import AlternatingLeastSquares

        c = self.config
        return AlternatingLeastSquares(
            factors=c.factors,
            regularization=c.regularization,
            alpha=c.alpha,
            iterations=c.iterations,
            random_state=options.seed,
            num_threads=options.threads,
        )

    def _fold_in(self, idx: list[int]) -> np.ndarray:
        y = self.item_factors.astype(np.float64)
        c = self.config
        # Confidence-weighted least squares: (Y'Y + Y_u'(C_u - I)Y_u + reg I) x = Y_u' C_u 1,
        # with C = alpha * r as implicit (>= 0.5) trains: confidence alpha for a binary r.
        a = y.T @ y + c.regularization * np.eye(y.shape[1])
        if idx:
            yu = y[sorted(set(idx))]
            a += (c.alpha - 1.0) * yu.T @ yu
            b = c.alpha * yu.sum(0)
        else:
            b = np.zeros(y.shape[1])
        return np.linalg.solve(a, b).astype(np.float32)


@MODELS.decorator("bpr")
class BPR(_MF):
    """Bayesian Personalised Ranking (Rendle et al. 2009) via ``implicit``; unseen users get
    the mean item factor of their history (the item bias column is kept)."""

    name = "bpr"

    def _make(self, options: TrainOptions):
        from implicit.cpu.bpr import BayesianPersonalizedRanking

        c = self.config
        return BayesianPersonalizedRanking(
            factors=c.factors,
            learning_rate=c.learning_rate,
            regularization=c.regularization,
            iterations=c.iterations * 5,
            random_state=options.seed,
            num_threads=options.threads,
        )

    def _fold_in(self, idx: list[int]) -> np.ndarray:
        if not idx:
            v = np.zeros(self.item_factors.shape[1], dtype=np.float32)
        else:
            v = self.item_factors[idx].mean(0)
        v = v.copy()
        v[-1] = 1.0  # implicit's BPR stores the item bias in the last column
        return v


class KNNConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    neighbours: int = Field(100, ge=1)
    shrink: float = Field(0.0, ge=0)


@MODELS.decorator("itemknn")
class ItemKNN(CFModel):
    """Item-based kNN (Sarwar et al. 2001): cosine between item columns of the binary
    interaction matrix, each item keeping its ``neighbours`` most similar; a user's score
    for item j is the sum of similarities between j and the history items."""

    name = "itemknn"
    Config = KNNConfig

    MAX_ITEMS = 40_000  # the dense item-item matrix needs items^2 floats

    def _fit(self, df: pd.DataFrame, options: TrainOptions) -> None:
        if len(self.items) > self.MAX_ITEMS:
            raise ValueError(
                f"ItemKNN keeps a dense {len(self.items)} x {len(self.items)} similarity matrix "
                f"(~{4 * len(self.items) ** 2 / 2**30:.0f} GiB); at most {self.MAX_ITEMS} items "
                "are supported. Filter the data first (recjudge.data.kcore, e.g. k = 10) or use "
                "als/bpr/sasrec."
            )
        ui = interaction_matrix(self, df).astype(np.float64)
        norms = np.sqrt(np.asarray(ui.multiply(ui).sum(0)).ravel())
        co = (ui.T @ ui).toarray()
        denom = np.outer(norms, norms) + self.config.shrink
        sim = np.divide(co, denom, out=np.zeros_like(co), where=denom > 0)
        np.fill_diagonal(sim, 0.0)
        k = min(self.config.neighbours, sim.shape[1])
        if k < sim.shape[1]:
            cut = np.argpartition(-sim, k - 1, axis=1)[:, :k]
            keep = np.zeros_like(sim, dtype=bool)
            np.put_along_axis(keep, cut, True, axis=1)
            sim = np.where(keep, sim, 0.0)
        self.sim = sim.astype(np.float32)  # row i: i's neighbours

    def score_history(self, history, user_id=None):
        idx = self.encode(history)
        if not idx:
            return np.zeros(len(self.items), dtype=np.float32)
        return self.sim[idx].sum(0)

    def score(self, history, candidates, user_id=None):
        """``score_history``'s values of ``candidates`` only (NaN for an unknown one),
        bit for bit: the history's rows of the candidates' columns, summed row after row as
        the whole rows are (a column block of at least two columns, so numpy keeps the same
        order; one column alone would be summed pairwise). A driver scores a user's 10
        candidates instead of the whole catalogue."""
        cols = [self.item_index.get(c) for c in candidates]
        known = [c for c in cols if c is not None]
        out = np.full(len(candidates), np.nan)
        if not known:
            return out
        idx = self.encode(history)
        if not idx:  # as score_history: zeros
            out[[i for i, c in enumerate(cols) if c is not None]] = 0.0
            return out
        take = known if len(known) > 1 else known * 2
        got = self.sim[np.ix_(idx, take)].sum(0)
        out[[i for i, c in enumerate(cols) if c is not None]] = got[: len(known)]
        return out

    def item_embeddings(self) -> np.ndarray:
        return self.sim

    def _tensors(self):
        return {"sim": self.sim}

    def _restore(self, t):
        self.sim = t["sim"]


class PopConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


@MODELS.decorator("pop")
class Pop(CFModel):
    """Most-popular baseline: score = number of training interactions of the item."""

    name = "pop"
    Config = PopConfig

    def _fit(self, df, options):
        counts = df["item_id"].astype(str).map(self.item_index).value_counts()
        self.counts = np.zeros(len(self.items), dtype=np.float32)
        self.counts[counts.index.astype(int)] = counts.to_numpy()

    def score_history(self, history, user_id=None):
        return self.counts.copy()

    def _tensors(self):
        return {"counts": self.counts}

    def _restore(self, t):
        self.counts = t["counts"]


class ItemItemConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    top_k: int = Field(5, ge=1)


class ItemItemSimilarity(CFModel):
    """sigma from item-item similarity: cosine between l2-normalised item embeddings of a
    trained model (SASRec or MF); score = mean of the ``top_k`` similarities between the
    candidate and the history items. Built from a model, not trained on its own."""

    name = "item-item"
    Config = ItemItemConfig

    @classmethod
    def from_model(cls, base: CFModel, config: ItemItemConfig | None = None) -> ItemItemSimilarity:
        m = cls(config)
        m.items, m.item_index = list(base.items), dict(base.item_index)
        emb = np.asarray(base.item_embeddings(), dtype=np.float32)
        norm = np.linalg.norm(emb, axis=1, keepdims=True)
        m.emb = np.divide(emb, norm, out=np.zeros_like(emb), where=norm > 0)
        m.train_info = {"base": base.name}
        return m

    def score_history(self, history, user_id=None):
        idx = self.encode(history)
        if not idx:
            return np.zeros(len(self.items), dtype=np.float32)
        sims = self.emb @ self.emb[idx].T  # [items, history]
        k = min(self.config.top_k, sims.shape[1])
        top = -np.partition(-sims, k - 1, axis=1)[:, :k] if k < sims.shape[1] else sims
        return top.mean(1)

    def score(self, history, candidates, user_id=None):
        """Only the candidates' rows of ``score_history`` (the same values; a full row over a
        large catalogue per (history, candidate) pair made sigma and calibration slow)."""
        idx = self.encode(history)
        out = np.full(len(candidates), np.nan)
        known = [k for k, c in enumerate(candidates) if c in self.item_index]
        if not known:
            return out
        if not idx:
            out[known] = 0.0
            return out
        rows = [self.item_index[candidates[k]] for k in known]
        sims = self.emb[rows] @ self.emb[idx].T
        kk = min(self.config.top_k, sims.shape[1])
        top = -np.partition(-sims, kk - 1, axis=1)[:, :kk] if kk < sims.shape[1] else sims
        out[known] = top.mean(1)
        return out

    def _tensors(self):
        return {"emb": self.emb}

    def _restore(self, t):
        self.emb = t["emb"]


MODELS.register("item-item", ItemItemSimilarity)
