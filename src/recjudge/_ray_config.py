"""Where and how wide a distributed judgment runs (``RayConfig``): pure pydantic, so the
command line builds its options, and a job config checks them, without importing Ray or
torch; ``recjudge.distributed`` runs them."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class RayConfig(BaseModel):
    """Where and how wide a distributed judgment runs. Not part of any result key: the
    workers compute what one process computes (same dtype and device, resolved once on the
    driver), and a pair's key names the device when it is a GPU.

    Attributes:
        address: ``auto`` (the cluster this machine belongs to: ``$RAY_ADDRESS`` or the one
            ``ray start`` started here), ``local`` (start a Ray instance in this process,
            bound to 127.0.0.1, for one machine), or a head's ``HOST:PORT`` / ``ray://``
            address.
        actors: how many workers judge at once (each holds one copy of the model).
        threads: CPU cores per worker (its torch threads).
        gpus: GPUs per worker (0: CPU workers; 1: one GPU each, the model on ``cuda``).
        vllm: how ``backend="vllm"`` runs on the workers: ``ray-data-llm`` (Ray Data LLM's
            vLLM stage, ``ray.data.llm``; the driver builds every request and replays every
            decision record, the workers only run vLLM) or ``actors`` (recjudge's whole
            judge in each Ray Data actor, vLLM inside it). The same answers either way.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    address: str = "auto"
    actors: int = Field(2, ge=1, le=4096)
    threads: int = Field(1, ge=1, le=512)
    gpus: float = Field(0.0, ge=0.0, le=64.0)
    vllm: Literal["ray-data-llm", "actors"] = "ray-data-llm"

    @field_validator("address")
    @classmethod
    def _address(cls, v: str) -> str:
        v = v.strip()
        if not v or any(c.isspace() for c in v) or len(v) > 512:
            raise ValueError(
                "a Ray address is auto, local, HOST:PORT or ray://HOST:PORT (no spaces)"
            )
        return v
