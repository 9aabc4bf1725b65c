"""Status and report shapes of a checkpoint engine's two cores (pydantic): the trainer's publisher and the
rollout's engine (`tandem.sidecars.rollout_engine`).

Callers: publisher.py and the rollout engine return them, api.py and metrics.py serialise them, the rollout
sidecar and the RL driver read them. The rollout's request shapes are `tandem.sidecars.rollout_engine.sampling`.
"""

from __future__ import annotations

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
    stalled_s: float = 0.0  # how long the call into vLLM now in progress has gone without progress; 0 between calls
    busy: str | None = None  # that call: step (generation), reload, add adapter; None between calls
    stall_deadline_s: float | None = None  # how long that call (between calls: a step) may go without progress
    stall_deadline: str | None = None  # how that deadline was derived (rollout: its stall_deadline policy)
    recoveries: int = 0  # generations served again after a failure (rollout)
    recovery_s: float | None = None  # seconds from the latest failure found to the first generation after it
