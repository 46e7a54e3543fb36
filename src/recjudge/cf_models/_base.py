"""The CF model interface, the sigma scaler, and safetensors + JSON persistence."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from recjudge._registry import Registry
from recjudge._util import UserFacingError, atomic_dir, json_loads, torch_seeded, torch_threads

log = logging.getLogger(__name__)


class TrainOptions(BaseModel):
    """Options shared by every CF model's ``train``.

    Attributes:
        min_rating: keep only interactions with rating >= this (e.g. 4 trains a model of
            liking rather than watching); None keeps all.
        seed: random seed (numpy/torch/implicit).
        threads: CPU threads for training.
        progress: show progress bars.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    min_rating: float | None = None
    seed: int = 0
    threads: int = Field(1, ge=1)
    progress: bool = True


class SignalConfig(BaseModel):
    """How raw scores become sigma in [-1, 1].

    Attributes:
        method: ``linear`` maps the calibration quantiles ``low_q``/``high_q`` to -1/+1 and
            clips; ``sigmoid`` is ``2*sigmoid(s)-1``; ``exp`` applies the published reshape
            ``sign(p)*(exp(2|p|)-1)/(exp(2)-1)`` to the linear value p.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    method: Literal["linear", "sigmoid", "exp"] = "linear"
    low_q: float = Field(0.05, ge=0, lt=1)
    high_q: float = Field(0.95, gt=0, le=1)


class SignalScaler:
    """Scores -> sigma in [-1, 1]. ``fit`` sets the linear scale from calibration scores."""

    def __init__(
        self,
        config: SignalConfig | None = None,
        low: float | None = None,
        high: float | None = None,
    ) -> None:
        self.config = config or SignalConfig()
        self.low, self.high = low, high

    def fit(self, scores: np.ndarray) -> SignalScaler:
        scores = np.asarray(scores, dtype=float)
        scores = scores[np.isfinite(scores)]
        if scores.size < 2:
            raise ValueError("need at least two finite calibration scores")
        self.low = float(np.quantile(scores, self.config.low_q))
        self.high = float(np.quantile(scores, self.config.high_q))
        if not self.high > self.low:
            self.high = self.low + 1e-6
        return self

    def __call__(self, scores: np.ndarray | float) -> np.ndarray:
        s = np.asarray(scores, dtype=float)
        if self.config.method == "sigmoid":
            out = np.tanh(s / 2.0)  # = 2 / (1 + exp(-s)) - 1, without exp overflow
        else:
            if self.low is None or self.high is None:
                raise RuntimeError("the linear scale is not calibrated; call fit() first")
            out = np.clip(2.0 * (s - self.low) / (self.high - self.low) - 1.0, -1.0, 1.0)
            if self.config.method == "exp":
                out = np.sign(out) * (np.exp(2 * np.abs(out)) - 1) / (math.exp(2) - 1)
        out = np.where(np.isfinite(out), out, 0.0)  # NaN never reaches the logits
        return np.clip(out, -1.0, 1.0)

    def state(self) -> dict[str, Any]:
        return {"config": self.config.model_dump(), "low": self.low, "high": self.high}

    @classmethod
    def from_state(cls, d: dict[str, Any]) -> SignalScaler:
        return cls(SignalConfig(**d["config"]), d["low"], d["high"])


@dataclass(frozen=True)
class SideInfo:
    """Item and user attributes for models that use features (FM, DeepFM, NRMS).

    Attributes:
        items: one row per item: ``item_id`` plus attribute columns (``title``, ``genres``
            as ``a|b|c``, ``year``, ...).
        users: one row per user: ``user_id`` plus attribute columns (``gender``, ``age``,
            ``occupation``, ...), or None when the data has no users file.
        source: where the tables came from, named in errors.
    """

    items: pd.DataFrame
    users: pd.DataFrame | None = None
    source: str = "the dataset"

    @classmethod
    def of(cls, dataset: Any) -> SideInfo:
        """The side information of a loaded :class:`recjudge.data.Dataset`."""
        return cls(dataset.items, getattr(dataset, "users", None), str(dataset.name))


class CFModel:
    """Base class. Subclasses implement ``_fit``, ``_user_vectors`` or ``score_history``, and
    ``_tensors``/``_restore`` for persistence.

    Items are strings; ``items`` is the catalogue the model can score. A user is described by
    their history (item ids, oldest first); a trained user id may be given to use its
    learned representation.
    """

    name: ClassVar[str] = "base"
    Config: ClassVar[type[BaseModel]]
    #: trained with torch: training runs on ``TrainOptions.threads`` torch threads (scoped)
    uses_torch: ClassVar[bool] = False
    #: needs item/user attributes (``SideInfo``) to train
    uses_side_info: ClassVar[bool] = False

    def __init__(self, config: BaseModel | None = None) -> None:
        self.config = config if config is not None else self.Config()
        self.items: list[str] = []
        self.item_index: dict[str, int] = {}
        self.user_index: dict[str, int] = {}
        self.scaler = SignalScaler()
        self.unknown_candidates = 0
        self.train_info: dict[str, Any] = {}

    # -- training -----------------------------------------------------------------------
    def is_trained(self) -> bool:
        return bool(self.items)

    def train(
        self,
        interactions: pd.DataFrame,
        options: TrainOptions | None = None,
        items: Sequence[str] | None = None,
        side: SideInfo | None = None,
    ) -> CFModel:
        """Fit on ``interactions`` (user_id, item_id, timestamp, rating columns).

        ``side`` carries item/user attributes; models with ``uses_side_info`` need it and
        ignore nothing silently (a missing column is an error naming it).
        """
        options = options or TrainOptions()
        if self.uses_side_info and side is None:
            raise CFModelError(
                f"{self.name} uses item/user attributes: pass side=SideInfo.of(dataset) "
                f"(`recjudge cf train {self.name} --data DATA` does)"
            )
        needed = ["user_id", "item_id", "timestamp"]
        needed += ["rating"] if options.min_rating is not None else []
        missing = [c for c in needed if c not in interactions.columns]
        if missing:
            raise CFModelError(
                f"{self.name}: the interactions have no column(s) {missing} (found "
                f"{list(interactions.columns)}); load your files with "
                "recjudge.data.load_from_files(..., mapping=...), which names them"
            )
        df = interactions
        if options.min_rating is not None:
            df = df[df["rating"] >= options.min_rating]
            self.train_info["min_rating"] = options.min_rating
        if df.empty:
            raise ValueError("no training interactions left (check min_rating)")
        universe = list(items) if items is not None else sorted(df["item_id"].astype(str).unique())
        self.items = [str(i) for i in universe]
        self.item_index = {it: i for i, it in enumerate(self.items)}
        df = df.sort_values(["user_id", "timestamp"], kind="stable")
        users = df["user_id"].astype(str).unique().tolist()
        self.user_index = {u: i for i, u in enumerate(users)}
        self.train_info.update(
            {
                "interactions": int(len(df)),
                "users": len(users),
                "items": len(self.items),
                "seed": options.seed,
            }
        )
        if self.uses_side_info:
            assert side is not None
            self._set_side_info(side)
        # Torch models train on ``options.threads`` from weights drawn under ``options.seed``,
        # and give the process its thread count and generator state back.
        if self.uses_torch:
            with torch_threads(options.threads), torch_seeded(options.seed):
                self._fit(df, options)
        else:
            self._fit(df, options)
        return self

    def _fit(self, df: pd.DataFrame, options: TrainOptions) -> None:
        raise NotImplementedError

    def _set_side_info(self, side: SideInfo) -> None:
        """Encode the attributes the model uses (called before ``_fit``)."""
        raise NotImplementedError

    # -- scoring ------------------------------------------------------------------------
    def encode(self, history: Sequence[str]) -> list[int]:
        return [self.item_index[h] for h in history if h in self.item_index]

    def score_history(self, history: Sequence[str], user_id: str | None = None) -> np.ndarray:
        """Raw scores of every catalogue item for one user (higher = more likely)."""
        raise NotImplementedError

    def score_many(
        self, histories: Sequence[Sequence[str]], user_ids: Sequence[str | None] | None = None
    ) -> np.ndarray:
        """``[n_users, n_items]`` scores; equal row by row to ``score_history``."""
        user_ids = user_ids or [None] * len(histories)
        return np.stack(
            [self.score_history(h, u) for h, u in zip(histories, user_ids, strict=True)]
        )

    def score(
        self, history: Sequence[str], candidates: Sequence[str], user_id: str | None = None
    ) -> np.ndarray:
        """Raw scores for ``candidates``; NaN for items the model does not know."""
        full = self.score_history(history, user_id)
        return np.array(
            [full[self.item_index[c]] if c in self.item_index else np.nan for c in candidates]
        )

    def calibrate(
        self,
        histories: Sequence[Sequence[str]],
        candidates: Sequence[str],
        user_ids: Sequence[str | None] | None = None,
        config: SignalConfig | None = None,
    ) -> SignalScaler:
        """Fit the sigma scale on (history, candidate) pairs, typically validation items
        together with random negatives so both ends of the range are seen."""
        user_ids = user_ids or [None] * len(histories)
        scores = [
            self.score(h, [c], u)[0]
            for h, c, u in zip(histories, candidates, user_ids, strict=True)
        ]
        self.scaler = SignalScaler(config or self.scaler.config).fit(np.array(scores))
        return self.scaler

    def sigma(self, history: Sequence[str], candidate: str, user_id: str | None = None) -> float:
        """The behavioural signal in [-1, 1]. An unknown candidate gives 0 (and is counted)."""
        return float(self.sigmas(history, [candidate], user_id)[0])

    def sigmas(
        self, history: Sequence[str], candidates: Sequence[str], user_id: str | None = None
    ) -> np.ndarray:
        raw = self.score(history, candidates, user_id)
        unknown = ~np.isfinite(raw)
        if unknown.any():
            self.unknown_candidates += int(unknown.sum())
            log.warning(
                "%s: %d candidate(s) unknown to the model get sigma = 0 (%d so far)",
                self.name,
                int(unknown.sum()),
                self.unknown_candidates,
            )
        return np.where(unknown, 0.0, self.scaler(np.where(unknown, 0.0, raw)))

    def recommend(
        self,
        history: Sequence[str],
        k: int = 10,
        user_id: str | None = None,
        exclude_seen: bool = True,
    ) -> list[str]:
        """Top-k item ids, excluding the history; ties broken by item order (stable)."""
        s = self.score_history(history, user_id).astype(float).copy()
        if exclude_seen:
            s[self.encode(history)] = -np.inf
        top = np.argsort(-s, kind="stable")[:k]
        return [self.items[i] for i in top if np.isfinite(s[i])]

    def item_embeddings(self) -> np.ndarray:
        raise NotImplementedError(f"{self.name} has no item embeddings")

    # -- persistence --------------------------------------------------------------------
    def _tensors(self) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def _restore(self, tensors: dict[str, np.ndarray]) -> None:
        raise NotImplementedError

    def _meta(self) -> dict[str, Any]:
        """JSON-able state beyond the tensors (vocabularies, ...), saved in ``model.json``."""
        return {}

    def _restore_meta(self, meta: dict[str, Any]) -> None:
        """Inverse of ``_meta`` (called before ``_restore``)."""

    def save(self, path: str | Path) -> Path:
        """Write ``model.safetensors`` and ``model.json`` (config, ids, scaler) atomically."""
        from safetensors.numpy import save_file

        if not self.is_trained():
            raise RuntimeError("train the model before saving it")
        path = Path(path)
        with atomic_dir(path) as tmp:
            tensors = {k: np.ascontiguousarray(v) for k, v in self._tensors().items()}
            save_file(tensors, str(tmp / "model.safetensors"))
            meta = {
                "model": self.name,
                "config": self.config.model_dump(),
                "items": self.items,
                "users": list(self.user_index),
                "scaler": self.scaler.state(),
                "train_info": self.train_info,
                "extra": self._meta(),
            }
            (tmp / "model.json").write_text(json.dumps(meta, default=str))
        return path


MODELS: Registry[type[CFModel]] = Registry("CF model")


def load_model(path: str | Path) -> CFModel:
    """Load a saved model (safetensors + JSON; nothing is unpickled)."""
    from safetensors.numpy import load_file

    path = Path(path)
    meta_path = path / "model.json"
    if not meta_path.exists():
        raise FileNotFoundError(
            f"{path} is not a saved CF model (no model.json); train one with `recjudge cf train`"
        )
    current = meta_path
    try:
        meta = json_loads(meta_path.read_text())
        cls = MODELS.get(meta["model"])
        model = cls(cls.Config(**meta["config"]))
        model.items = meta["items"]
        model.item_index = {it: i for i, it in enumerate(model.items)}
        model.user_index = {u: i for i, u in enumerate(meta["users"])}
        model.scaler = SignalScaler.from_state(meta["scaler"])
        model.train_info = meta.get("train_info", {})
        model._restore_meta(meta.get("extra", {}))
        current = path / "model.safetensors"
        model._restore(load_file(str(current)))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        # safetensors raises its own SafetensorError (not an OSError) for a damaged file.
        raise CFModelError(f"{current}: not readable as a saved CF model ({type(e).__name__}: "
                           f"{str(e).strip(chr(39))}). Fix: train it again with `recjudge cf "
                           "train MODEL --data DATA --out DIR`") from None  # fmt: skip
    except Exception as e:
        if type(e).__name__ != "SafetensorError":
            raise
        raise CFModelError(f"{current}: damaged weights ({e}). Fix: train it again with "
                           "`recjudge cf train MODEL --data DATA --out DIR`") from None  # fmt: skip
    return model


def trained_on(model: CFModel) -> str:
    """Where the model's training data can be loaded from (a dataset name or folder)."""
    info = model.train_info
    return str(info.get("dataset_location") or info.get("dataset") or "ml-1m")


class CFModelError(UserFacingError, ValueError):
    """A saved CF model folder that cannot be read (names the file), or training input a
    model cannot use (names the column or argument)."""


class CFMismatchError(UserFacingError, ValueError):
    """A CF model used on data it was not trained on (sigma would be 0 for unknown items)."""


def check_fits(model: CFModel, dataset: Any, *, allow_mismatch: bool = False) -> float:
    """Check that ``model`` was trained on ``dataset``'s items; return the share of the
    dataset's items it knows.

    A model trained elsewhere knows few of these items and silently gives sigma 0 for the
    rest, so that is an error unless ``allow_mismatch``.

    Raises:
        CFMismatchError: the model's training dataset differs by name, or it knows fewer
            than half of the dataset's items.
    """
    items = dataset.items["item_id"].astype(str)
    known = float(items.isin(model.item_index).mean()) if len(items) else 0.0
    trained_on = model.train_info.get("dataset")
    renamed = trained_on is not None and trained_on != dataset.name
    if (renamed or known < 0.5) and not allow_mismatch:
        where = f"dataset {trained_on!r}" if trained_on else "other data"
        raise CFMismatchError(
            f"the CF model was trained on {where} ({len(model.items):,} items); "
            f"{dataset.name!r} has {len(items):,} items, of which {known:.0%} are known to it, "
            "and every unknown candidate would get sigma 0. Train one on this data (`recjudge "
            f"cf train NAME --data {dataset.name} --out DIR`), or pass --allow-cf-mismatch"
        )
    return known
