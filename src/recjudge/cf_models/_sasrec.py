"""SASRec (Kang & McAuley, ICDM 2018) in PyTorch, following the published recipe."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field
from tqdm.auto import tqdm

from recjudge._util import json_loads
from recjudge.cf_models._base import MODELS, CFModel, TrainOptions


class SASRecConfig(BaseModel):
    """Defaults are the paper's ML-1M setting.

    Attributes:
        hidden: embedding size d. blocks/heads: transformer depth and heads.
        max_len: most recent items used (n). dropout: on embeddings and blocks.
        lr, betas: Adam. batch: users per batch. epochs: passes over users.
        loss: ``bce`` (one sampled negative per position, as published) or ``ce``
            (full softmax over the catalogue).
        l2_emb: L2 on item embeddings (the reference code's default is 0).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    hidden: int = Field(50, ge=1)
    blocks: int = Field(2, ge=1)
    heads: int = Field(1, ge=1)
    dropout: float = Field(0.2, ge=0, lt=1)
    max_len: int = Field(200, ge=2)
    lr: float = Field(1e-3, gt=0)
    betas: tuple[float, float] = (0.9, 0.98)
    batch: int = Field(128, ge=1)
    epochs: int = Field(200, ge=1)
    loss: Literal["bce", "ce"] = "bce"
    l2_emb: float = Field(0.0, ge=0)


def _build_net(n_items: int, c: SASRecConfig):
    import torch
    from torch import nn

    class PointWiseFF(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.l1 = nn.Linear(c.hidden, c.hidden)
            self.l2 = nn.Linear(c.hidden, c.hidden)
            self.drop1 = nn.Dropout(c.dropout)
            self.drop2 = nn.Dropout(c.dropout)

        def forward(self, x):
            return self.drop2(self.l2(torch.relu(self.drop1(self.l1(x))))) + x

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.item_emb = nn.Embedding(n_items + 1, c.hidden, padding_idx=0)
            self.pos_emb = nn.Embedding(c.max_len, c.hidden)
            self.emb_drop = nn.Dropout(c.dropout)
            self.attn_norms = nn.ModuleList(
                nn.LayerNorm(c.hidden, eps=1e-8) for _ in range(c.blocks)
            )
            self.attns = nn.ModuleList(
                nn.MultiheadAttention(c.hidden, c.heads, c.dropout, batch_first=True)
                for _ in range(c.blocks)
            )
            self.ff_norms = nn.ModuleList(nn.LayerNorm(c.hidden, eps=1e-8) for _ in range(c.blocks))
            self.ffs = nn.ModuleList(PointWiseFF() for _ in range(c.blocks))
            self.last_norm = nn.LayerNorm(c.hidden, eps=1e-8)

        def forward(self, seq):  # seq: [B, L] item indices, 0 = padding (left-padded)
            x = self.item_emb(seq) * math.sqrt(c.hidden)
            pos = torch.arange(seq.shape[1], device=seq.device)
            x = self.emb_drop(x + self.pos_emb(pos)[None])
            keep = (seq != 0).unsqueeze(-1)
            x = x * keep
            L = seq.shape[1]
            # Masked (True) = a future key, or a padding key (the original SASRec's key
            # masking). The diagonal stays open so padding rows have a finite softmax.
            causal = torch.triu(torch.ones(L, L, dtype=torch.bool, device=seq.device), 1)
            pad_key = (seq == 0)[:, None, :].expand(-1, L, -1)
            diag = torch.eye(L, dtype=torch.bool, device=seq.device)[None]
            mask = (causal[None] | pad_key) & ~diag
            mask = mask.repeat_interleave(c.heads, dim=0)
            for norm, attn, fnorm, ff in zip(
                self.attn_norms, self.attns, self.ff_norms, self.ffs, strict=True
            ):
                q = norm(x)
                out, _ = attn(q, x, x, attn_mask=mask, need_weights=False)
                x = fnorm(q + out)
                x = ff(x) * keep
            return self.last_norm(x)  # [B, L, d]

    net = Net()
    for name, p in net.named_parameters():
        if p.dim() > 1:
            nn.init.xavier_normal_(p)
        if name == "item_emb.weight":
            with torch.no_grad():
                p[0].zero_()
    return net


@MODELS.decorator("sasrec")
class SASRec(CFModel):
    """Self-attentive sequential recommendation.

    The user representation is the last block's output at the last real (non-padding)
    position of the left-padded history; scores are its dot products with item embeddings.
    Training checkpoints every epoch (safetensors) and resumes from the last one.
    """

    name = "sasrec"
    Config = SASRecConfig
    uses_torch = True

    def __init__(self, config: SASRecConfig | None = None) -> None:
        super().__init__(config)
        self.net = None
        self.checkpoint_dir: Path | None = None
        self.on_epoch: Callable[[int, float, SASRec], dict[str, float] | None] | None = None

    # -- data ---------------------------------------------------------------------------
    def _pad(self, idx_seqs: Sequence[Sequence[int]], length: int) -> np.ndarray:
        out = np.zeros((len(idx_seqs), length), dtype=np.int64)
        for r, s in enumerate(idx_seqs):
            s = list(s)[-length:]
            if s:
                out[r, -len(s) :] = s
        return out

    def _fit(self, df: pd.DataFrame, options: TrainOptions) -> None:
        import torch

        c: SASRecConfig = self.config  # torch's generator is seeded by CFModel.train
        rng = np.random.default_rng(options.seed)
        seqs = (
            df.assign(ix=df["item_id"].astype(str).map(self.item_index) + 1)
            .groupby("user_id", sort=False)["ix"]
            .apply(list)
        )
        seqs = [s for s in seqs.tolist() if len(s) >= 2]
        self._user_seqs = seqs
        n = len(self.items)
        self.net = _build_net(n, c)
        opt = torch.optim.Adam(self.net.parameters(), lr=c.lr, betas=c.betas)
        start = self._resume(opt)
        inputs = self._pad([s[:-1] for s in seqs], c.max_len)
        targets = self._pad([s[1:] for s in seqs], c.max_len)
        user_sets = [np.array(sorted(set(s))) for s in seqs]
        history = self.train_info.setdefault("epochs", [])
        bar = tqdm(
            range(start, c.epochs),
            desc="sasrec",
            disable=not options.progress,
            initial=start,
            total=c.epochs,
        )
        for epoch in bar:
            self.net.train()
            t0 = time.perf_counter()
            order = rng.permutation(len(seqs))
            total, batches = 0.0, 0
            for b in range(0, len(order), c.batch):
                ix = order[b : b + c.batch]
                seq = torch.from_numpy(inputs[ix])
                pos = torch.from_numpy(targets[ix])
                h = self.net(seq)
                mask = pos != 0
                if c.loss == "bce":
                    neg = torch.from_numpy(self._negatives(rng, targets[ix], user_sets, ix, n))
                    pe = self.net.item_emb(pos)
                    ne = self.net.item_emb(neg)
                    pl = (h * pe).sum(-1)
                    nl = (h * ne).sum(-1)
                    loss = torch.nn.functional.binary_cross_entropy_with_logits(
                        pl[mask], torch.ones_like(pl[mask])
                    ) + torch.nn.functional.binary_cross_entropy_with_logits(
                        nl[mask], torch.zeros_like(nl[mask])
                    )
                else:
                    logits = h[mask] @ self.net.item_emb.weight[1:].T
                    loss = torch.nn.functional.cross_entropy(logits, pos[mask] - 1)
                if c.l2_emb:
                    loss = loss + c.l2_emb * self.net.item_emb.weight.norm() ** 2
                opt.zero_grad()
                loss.backward()
                opt.step()
                total += float(loss.detach())
                batches += 1
            rec = {
                "epoch": epoch + 1,
                "loss": total / max(batches, 1),
                "seconds": time.perf_counter() - t0,
            }
            if self.on_epoch is not None:
                self.net.eval()
                extra = self.on_epoch(epoch + 1, rec["loss"], self)
                rec.update(extra or {})
            history.append(rec)
            bar.set_postfix({k: round(v, 4) for k, v in rec.items() if k != "epoch"})
            self._checkpoint(opt, epoch + 1)
        self.net.eval()

    @staticmethod
    def _negatives(rng, pos: np.ndarray, user_sets, ix, n: int) -> np.ndarray:
        """One uniformly sampled item per position that the user never interacted with."""
        neg = rng.integers(1, n + 1, size=pos.shape)
        for r, u in enumerate(ix):
            seen = user_sets[u]
            bad = np.isin(neg[r], seen)
            while bad.any():
                neg[r, bad] = rng.integers(1, n + 1, size=int(bad.sum()))
                bad = np.isin(neg[r], seen)
        return np.where(pos == 0, 0, neg)

    # -- checkpoints ----------------------------------------------------------------------
    def _state_tensors(self, opt) -> dict[str, Any]:
        t = {f"net.{k}": v.detach().contiguous() for k, v in self.net.state_dict().items()}
        for i, group in enumerate(opt.state_dict()["state"].values()):
            for k, v in group.items():
                t[f"opt.{i}.{k}"] = (
                    v if hasattr(v, "dim") else __import__("torch").tensor(float(v))
                ).contiguous()
        return t

    def _checkpoint(self, opt, epoch: int) -> None:
        if self.checkpoint_dir is None:
            return
        from safetensors.torch import save_file

        d = Path(self.checkpoint_dir)
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / "checkpoint.safetensors.tmp"
        save_file(self._state_tensors(opt), str(tmp))
        meta = {
            "epoch": epoch,
            "config": self.config.model_dump(),
            "items": len(self.items),
            "train_info": self.train_info,
        }
        (d / "checkpoint.json.tmp").write_text(json.dumps(meta, default=str))
        tmp.replace(d / "checkpoint.safetensors")
        (d / "checkpoint.json.tmp").replace(d / "checkpoint.json")

    def _resume(self, opt) -> int:
        if self.checkpoint_dir is None:
            return 0
        d = Path(self.checkpoint_dir)
        if not (d / "checkpoint.json").exists():
            return 0
        from safetensors.torch import load_file

        meta = json_loads((d / "checkpoint.json").read_text())
        same = {k: v for k, v in meta["config"].items() if k != "epochs"}
        mine = {k: v for k, v in self.config.model_dump().items() if k != "epochs"}
        if json.loads(json.dumps(mine)) != same or meta["items"] != len(self.items):
            return 0  # a checkpoint of another run: start fresh (more epochs is the same run)
        t = load_file(str(d / "checkpoint.safetensors"))
        self.net.load_state_dict({k[4:]: v for k, v in t.items() if k.startswith("net.")})
        state = opt.state_dict()
        params = state["param_groups"][0]["params"]
        for i, p in enumerate(params):
            keys = [k for k in t if k.startswith(f"opt.{i}.")]
            if keys:
                state["state"][p] = {k.split(".", 2)[2]: t[k] for k in keys}
        opt.load_state_dict(state)
        self.train_info["epochs"] = meta["train_info"].get("epochs", [])
        return int(meta["epoch"])

    # -- scoring --------------------------------------------------------------------------
    def _represent(self, histories: Sequence[Sequence[str]]):
        import torch

        seqs = [[i + 1 for i in self.encode(h)] for h in histories]
        arr = torch.from_numpy(self._pad(seqs, self.config.max_len))
        with torch.inference_mode():
            h = self.net(arr)[:, -1, :]  # left padding: the last position is the last item
        return h

    def score_history(self, history, user_id=None):
        return self.score_many([history])[0]

    def score_many(self, histories, user_ids=None):
        import torch

        out = []
        for b in range(0, len(histories), 256):
            h = self._represent(histories[b : b + 256])
            with torch.inference_mode():
                out.append((h @ self.net.item_emb.weight[1:].T).numpy())
        return np.concatenate(out) if out else np.zeros((0, len(self.items)), np.float32)

    def item_embeddings(self) -> np.ndarray:
        return self.net.item_emb.weight[1:].detach().numpy()

    def _tensors(self):
        return {k: v.detach().numpy() for k, v in self.net.state_dict().items()}

    def _restore(self, t):
        import torch

        self.net = _build_net(len(self.items), self.config)
        self.net.load_state_dict({k: torch.from_numpy(v) for k, v in t.items()})
        self.net.eval()
