"""Data shapes shared by the rollout engine, the publisher and the control API (pydantic).

Callers: rollout_engine.py and publisher.py return them, api.py serialises them, the rollout
sidecar and the RL driver read them.
"""

from __future__ import annotations

import hashlib
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field


class Phase(StrEnum):
    STOPPED = "stopped"
    STARTING = "starting"
    READY = "ready"  # engine up, serving rollouts (dummy or loaded weights)
    UPDATING = "updating"
    SLEEPING = "sleeping"
    TERMINATING = "terminating"
    FAILED = "failed"  # the engine died or a reload failed half-way: terminate + start again
    PUBLISHING = "publishing"  # publisher side
    IDLE = "idle"  # publisher side, nothing in flight


class SamplingOptions(BaseModel):
    """The subset of vLLM's SamplingParams the RL loop uses."""

    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=-1, ge=-1)
    max_tokens: int = Field(default=64, ge=1)
    min_tokens: int = Field(default=0, ge=0)
    seed: int | None = None
    stop: list[str] = Field(default_factory=list)
    stop_token_ids: list[int] = Field(default_factory=list)
    ignore_eos: bool = False


def prompt_seeds(seed: int, count: int) -> list[int]:
    """One seed per prompt of a request seeded `seed`, unrelated to each other and to other requests': vLLM
    seeds a prompt's n samples s .. s+n-1, so prompts sharing the request's seed would draw the same random
    numbers, and seed + i would reuse the next prompt's. The rollout engine seeds each prompt so; the
    rollout client gives each rollout's slice of a request a seed of its own (`slice_seed`)."""
    return [_seed_of(f"{seed}:{i}") for i in range(count)]


def slice_seed(seed: int, offset: int) -> int:
    """The seed of the slice of a request that starts at prompt `offset` (the request's own at 0)."""
    return seed if offset == 0 else _seed_of(f"{seed}/{offset}")


def _seed_of(text: str) -> int:
    """A seed below 2**31 (vLLM's and torch's bound) hashed from `text`: nearby inputs, unrelated seeds."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=4).digest(), "big") % 2**31


class Completion(BaseModel):
    """One sampled completion: token ids and the log-prob of each sampled token."""

    prompt_index: int
    sample_index: int
    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str | None = None


class UpdateReport(BaseModel):
    version: int
    previous: int | None
    bytes: int
    tensors: int
    resolve_s: float = 0.0  # etcd: latest / version record / pin
    validate_s: float = 0.0  # index + names/shapes/dtypes + checksums
    load_s: float = 0.0  # collective_rpc reload in the workers + prefix-cache reset
    total_s: float = 0.0
    workers: list[dict[str, Any]] = Field(default_factory=list)

    @property
    def load_gbps(self) -> float:
        return self.bytes / self.load_s / 1e9 if self.load_s else 0.0


class PublishReport(BaseModel):
    version: int
    bytes: int
    tensors: int
    shards: int
    path: str
    write_s: float
    register_s: float
    gc_s: float
    total_s: float
    collected: list[int] = Field(default_factory=list)
    recycled_bytes: int = 0  # written into spare files of collected versions (pages already allocated)

    @property
    def write_gbps(self) -> float:
        return self.bytes / self.write_s / 1e9 if self.write_s else 0.0


class EngineStatus(BaseModel):
    role: str
    phase: Phase
    version: int | None = None
    model_dir: str | None = None
    dummy: bool = False
    error: str | None = None
    timings: dict[str, float] = Field(default_factory=dict)
    updated: float = 0.0
    restarts: int = 0  # engines started again after a failure (rollout)
    steps: int = 0  # calls into vLLM that returned: a client watches it advance (rollout)
    stalled_s: float = 0.0  # how long the call into vLLM now in progress has run; 0 between calls
    busy: str | None = None  # that call: step (generation), reload, add adapter; None between calls
