"""The job's progress record in etcd (`keys.progress`), written by the trainer driver (rank 0).

Callers: `tandem.sidecars.trainer` writes it after every phase; the operator reads it into the
RLHFJob status; `tandem run` prints it. JSON with camelCase keys.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

Phase = Literal["starting", "rollout", "inference", "train", "publish", "sync", "eval", "paused", "done", "failed"]


class EvalSummary(BaseModel):
    """The latest held-out evaluation: after `iteration` completed iterations, on `weightVersion`."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")
    iteration: int
    weight_version: int
    pass_at_1: float
    pass_at_k: float
    k: int
    prompts: int


class RolloutEngines(BaseModel):
    """The rollouts' vLLM engines as the driver has seen them since it started (the job's status.rolloutEngines):
    restarts in place (the rollout's supervisor), rollouts re-admitted to the pool, and the latest recovery."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")
    restarts: int = Field(default=0, description="vLLM engine restarts the job's rollouts reported (each rollout's "
                          "supervisor starting its engine again after a death or a hang), since the driver started.")
    rejoins: int = Field(default=0, description="Rollouts the driver dropped from its pool (gone, hung, failed) and "
                         "admitted again at the current weight version, since the driver started.")
    last_recovery_seconds: float | None = Field(default=None, description="The latest recovery: seconds from an "
                                                "engine found dead or hung to its first generation after the restart "
                                                "(the longest of the latest iteration that completed one).")


WAITING_FOR_ROLLOUTS = "waiting for a healthy rollout"  # the driver's message while no rollout is healthy


class Progress(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")
    phase: Phase = "starting"
    iteration: int = 0
    iterations: int = 0
    weight_version: int = 0
    last_sync_seconds: float | None = None
    reward_mean: float | None = None
    kl: float | None = None
    turns_mean: float | None = None  # multi-turn rollouts: model turns per trajectory, last iteration
    tool_calls_mean: float | None = None  # multi-turn rollouts: tool calls per trajectory, last iteration
    eval: EvalSummary | None = None  # the latest held-out evaluation (spec.eval)
    mismatch_kl: float | None = None  # rollout vs trainer, last iteration: mean k3 per model token
    ess: float | None = None  # the normalised effective sample size of its token ratios p_trainer / p_rollout
    staleness_mean: float | None = None  # weight versions between a trained completion's oldest segment and the update
    rows_refused: int = 0  # dataset rows left out at start (a picture that cannot be used: dataset.images)
    rollout_engines: RolloutEngines | None = None  # engine restarts, rejoins, the latest recovery (None: none seen)
    guard: str = ""  # algorithm.mismatchGuard's latest warning or pause ("" while it is quiet)
    message: str = ""  # why it failed or paused; while no healthy rollout, the driver's wait (WAITING_FOR_ROLLOUTS ...)
    updated_at: float = Field(default=0.0, description="Unix time of this record.")

    @property
    def waiting_for_rollouts(self) -> bool:
        """The driver waits for a healthy rollout (`RolloutClient`): the operator's RolloutsAvailable False."""
        return self.phase not in ("done", "failed") and self.message.startswith(WAITING_FOR_ROLLOUTS)

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True)

    @classmethod
    def from_json(cls, raw: str | bytes) -> Progress:
        return cls.model_validate_json(raw)
