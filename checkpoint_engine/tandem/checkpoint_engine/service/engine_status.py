"""Status and report shapes of a checkpoint engine's two cores (pydantic): the trainer's publisher and the
rollout's engine (`tandem.sidecars.rollout_engine`).

Callers: publisher.py and the rollout engine return them, api.py and metrics.py serialise them (api.py's
/health body is `Health`), the rollout sidecar and the RL driver read them. The rollout's request and answer
shapes are `tandem.sidecars.rollout_engine.contract`, which re-exports these.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


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
    pids: list[int] = Field(default_factory=list)  # the serving engine's processes (rollout: vLLM's core, workers)
    spare: str | None = None  # rollout.spareEngine: none | starting | ready | failed; None without one
    spares_taken: int = 0  # restarts that adopted the spare instead of a cold start


def _rounded(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


class Health(BaseModel):
    """GET /health's body (camelCase on the wire), no token: whether the engine serves, its progress and
    deadline (the driver's hung-call watch), its restarts and latest recovery, the serving engine's processes and
    its spare's state (rollout.spareEngine). Every field has a default, so
    a partial body (an older or a stand-in rollout) still reads."""

    model_config = ConfigDict(populate_by_name=True)

    ok: bool = True
    phase: str | None = None
    version: int | None = None
    steps: int = 0
    stalled_s: float = Field(default=0.0, alias="stalledS")
    busy: str | None = None
    restarts: int = 0
    error: str | None = None
    stall_deadline_s: float | None = Field(default=None, alias="stallDeadlineS")
    stall_deadline: str | None = Field(default=None, alias="stallDeadline")
    recoveries: int = 0
    recovery_s: float | None = Field(default=None, alias="recoveryS")
    pids: list[int] = Field(default_factory=list)
    spare: str | None = None
    spares_taken: int = Field(default=0, alias="sparesTaken")

    @classmethod
    def of(cls, st: EngineStatus, serving: bool) -> Health:
        return cls.model_validate({
            "ok": serving, "phase": st.phase.value, "version": st.version, "steps": st.steps,
            "stalledS": round(st.stalled_s, 3), "busy": st.busy, "restarts": st.restarts, "error": st.error,
            "stallDeadlineS": _rounded(st.stall_deadline_s), "stallDeadline": st.stall_deadline,
            "recoveries": st.recoveries, "recoveryS": _rounded(st.recovery_s), "pids": st.pids, "spare": st.spare,
            "sparesTaken": st.spares_taken})

    def body(self) -> dict[str, Any]:
        """The JSON body as served."""
        return self.model_dump(mode="json", by_alias=True)
