"""The judge's options every judging job takes (``JudgeOptions``: ``judge``, ``impute``,
``augment``) and ``recjudge judge``'s config (``JudgeJob``): pure pydantic, so the command line
builds their options without importing torch; ``recjudge.evaluators`` runs them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from recjudge._ray_config import RayConfig

#: ``recjudge judge``'s one line (the command's help, the job's summary)
JUDGE_SUMMARY = "Judge one (user, candidate) pair, or every pair in --pairs with a progress bar."
#: where a job's warnings go (the command line: stderr)
Warn = Callable[[str], None]


class JudgeOptions(BaseModel):
    """The judge's options shared by ``judge``, ``impute`` and ``augment``
    (``reward.build_judge``'s, and ``--ray`` as a ``RayConfig``).

    Which of them enter a judgment's key is the judge's ``JudgeConfig`` business; ``resume``
    and ``allow_cf_mismatch`` only decide whether the job may go on.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = Field(
        "smollm2-135m", description="Judge LLM (preset, path or id); the default is the "
        "embedded model set-up installs."
    )  # fmt: skip
    cf: str | None = Field(None, description="A saved CF model folder (sigma source).")
    mode: str = Field(
        "brief", description="brief, non-adaptive, no-behavior, zero-shot, pub, agent4rec..."
    )
    beta: float = Field(25.0, description="Bias strength of the adaptive bias.")
    no_evidence: bool = Field(False, description="Stop at the decision step (labels only, faster).")
    batch_size: int | None = Field(
        None, ge=1, description="Pairs decoded together (default: all of a user's candidates, "
        "up to 64)."
    )  # fmt: skip
    max_history: int = Field(50, ge=1, description="History items the judge reads per user.")
    layout: Literal["candidate-last", "question-last"] = Field(
        "candidate-last", description="Where the candidate sits: candidate-last (the paper's "
        "prompt) or question-last (the candidate, then the question: item text is not the last "
        "thing read before the answer; see docs/reliability.md)."
    )  # fmt: skip
    marking: Literal["plain", "datamark"] = Field(
        "plain", description="How item text is shown: plain, or datamark (its words joined by a "
        "mark the system message declares as data; spotlighting, see docs/reliability.md)."
    )  # fmt: skip
    allow_cf_mismatch: bool = Field(
        False, description="Use a CF model trained on other data than --data."
    )
    resume: bool = Field(False, description="Continue OUT/store.sqlite (reuses finished pairs).")
    device: str = Field(
        "auto", description="In process: auto (CUDA when available), cpu, cuda or cuda:N."
    )
    ray: str | None = Field(
        None, description="Judge on a Ray cluster: auto (the one `ray start` joined here), "
        "local (one machine), or the head's HOST:PORT. The CF model and the store stay here."
    )  # fmt: skip
    ray_actors: int = Field(2, ge=1, le=4096, description="With --ray: workers (model copies).")
    ray_threads: int = Field(1, ge=1, le=512, description="With --ray: CPU cores per worker.")
    ray_gpus: float = Field(
        0.0, ge=0.0, le=64.0, description="With --ray: GPUs per worker (0: CPU workers)."
    )
    ray_vllm: Literal["ray-data-llm", "actors"] = Field(
        "ray-data-llm", description="With --ray --backend vllm: ray-data-llm (Ray Data LLM's "
        "vLLM stage) or actors (the whole judge in each worker)."
    )  # fmt: skip

    @model_validator(mode="after")
    def _ray_ok(self) -> JudgeOptions:
        """A bad ``--ray`` value is named as ``--ray`` (``RayConfig`` calls it ``address``)."""
        try:
            self.ray_config()
        except ValidationError as e:
            msg = str(e.errors()[0]["msg"]).removeprefix("Value error, ")
            raise ValueError(f"--ray: {msg}") from None
        return self

    def ray_config(self) -> Any:
        """The ``RayConfig`` of ``--ray`` (None without it)."""
        if self.ray is None:
            return None

        return RayConfig(address=self.ray, actors=self.ray_actors, threads=self.ray_threads,
                         gpus=self.ray_gpus, vllm=self.ray_vllm)  # fmt: skip


class JudgeJob(JudgeOptions):
    """``recjudge judge``: ``--user`` and ``--candidate`` for one judgment, or ``--pairs``
    and ``--out`` for a file of them (through a store: ``--resume`` goes on after a crash).

    Attributes:
        samples: estimate P(YES) from N samples (T 0.7, top-p 0.8); 0: greedy.
        seed: sampling and CF-training seed.
        backend: transformers, vllm or openai-compatible.
        server: URL of a ``recjudge serve`` server (implies ``openai-compatible``; API key
            from ``$RECJUDGE_API_KEY``).
    """

    data: str = Field("ml-1m", description="Dataset name or saved folder.")
    user: str | None = Field(None, description="User id (single judgment).")
    candidate: str | None = Field(
        None, description="Item id or exact title; id:X or title:X when X could be either."
    )
    pairs: str | None = Field(None, description="JSONL of {user_id, item_id} to score.")
    out: str | None = Field(None, description="Results JSONL for --pairs.")
    store: str | None = Field(None, description="SQLite store (default: OUT.sqlite).")
    repair: bool = Field(
        False, description="With --resume: salvage a damaged store's readable rows first."
    )
    retry_failed: bool = Field(
        False, description="With --resume: judge again the pairs that failed before."
    )
    samples: int = Field(0, ge=0, description="Estimate P(YES) from N samples (T 0.7, top-p 0.8).")
    seed: int = Field(0, description="Sampling and CF-training seed.")
    backend: str = Field("transformers", description="transformers | vllm | openai-compatible.")
    server: str | None = Field(
        None, description="URL of a `recjudge serve` server, e.g. http://127.0.0.1:8000/v1 "
        "(implies --backend openai-compatible; API key from $RECJUDGE_API_KEY)."
    )  # fmt: skip

    @model_validator(mode="after")
    def _what(self) -> JudgeJob:
        if self.ray is not None and self.pairs is None:  # before any cluster starts
            raise ValueError(
                "--ray judges a --pairs file on a cluster; one --user/--candidate judgment "
                "runs in this process: drop --ray, or give --pairs FILE --out FILE"
            )
        return self
