"""The one epoch loop of the PyTorch models trained from scratch (FM, DeepFM, LightGCN, NRMS).

SASRec keeps its own loop for its per-epoch checkpoints; these models train in minutes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from tqdm.auto import tqdm


def fit_epochs(
    name: str,
    params: Any,
    epochs: int,
    lr: float,
    batches: Callable[[np.random.Generator], Iterator[Any]],
    seed: int,
    progress: bool,
    train_info: dict[str, Any],
    weight_decay: float = 0.0,
) -> None:
    """Adam over ``epochs`` passes; ``batches(rng)`` yields one loss tensor per batch.

    Each epoch appends ``{"epoch", "loss", "seconds"}`` to ``train_info["epochs"]`` (the
    mean batch loss), which is what ``training_seconds`` sums.

    Raises:
        FloatingPointError: the loss became NaN or infinite (lower the learning rate).
    """
    import torch

    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    opt = torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
    history = train_info.setdefault("epochs", [])
    bar = tqdm(range(epochs), desc=name, disable=not progress)
    for epoch in bar:
        t0 = time.perf_counter()
        total, count = 0.0, 0
        for loss in batches(rng):
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += float(loss.detach())
            count += 1
        mean = total / max(count, 1)
        if not np.isfinite(mean):
            raise FloatingPointError(
                f"{name}: the training loss is {mean} at epoch {epoch + 1}; lower the config's lr"
            )
        rec = {"epoch": epoch + 1, "loss": mean, "seconds": time.perf_counter() - t0}
        history.append(rec)
        bar.set_postfix(loss=round(mean, 4))
