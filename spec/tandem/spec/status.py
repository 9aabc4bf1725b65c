"""The RLHFJob's status: what the operator writes after each reconcile pass and `tandem run` shows.

Role: the typed shape of `.status` (phase, iteration, weight version, the latest figures, restarts and
preemptions, progress and ETA, the rollout-only pool's replacements, the rollouts' engine counts, the latest
evaluation, conditions), read leniently (unknown fields ignored) so that an older operator's record still parses.
Callers: `tandem.spec.models.RLHFJob.status`, the operator's policies (`tandem.operator.policies.job_status`,
`eta`, `pool_policy`), the CLI's table.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field
from pydantic.alias_generators import to_camel

from tandem.spec.progress import RolloutEngines
from tandem.spec.strict_model import Base


class Condition(Base):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", strict=False)
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str = ""
    message: str = ""
    last_transition_time: str = ""
    observed_generation: int = Field(default=0, description="metadata.generation the condition was set from.")


class EvalStatus(Base):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", strict=False)
    iteration: int = Field(description="Iterations completed when evaluated (0: the initial model).")
    pass_at_1: float | None = None
    pass_at_k: float | None = None
    k: int = 1


class ProgressStatus(Base):
    """Progress of the run, from the driver's progress record (`tandem.operator.policies.eta`)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", strict=False)
    percent: float = Field(default=0.0, description="Iterations done of algorithm.iterations, in percent.")
    iterations_per_second: float | None = None
    eta_seconds: int | None = Field(default=None, description="Estimated seconds until the last iteration.")
    eta: str = Field(default="", description="etaSeconds for people (the ETA column), e.g. 1h05m.")
    rate_since_iteration: int = Field(default=0, description="The rate is measured from this iteration...")
    rate_since_time: float = Field(default=0.0, description="...reached at this Unix time (driver's clock)...")
    rate_since_generation: int = Field(default=0, description="...by this restart generation of the gang.")


class ReplacingPod(Base):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", strict=False)
    pod: str
    uid: str = Field(default="", description="The lost pod's metadata.uid (empty: it was gone when seen).")
    generation: int = 0


class RolloutPoolStatus(Base):
    """The operator's record of replacing lost rollout-only pods (`tandem.operator.policies.pool_policy`)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", strict=False)
    replacing: list[ReplacingPod] = Field(default_factory=list, description="Lost pods already counted whose "
                                          "replacement does not exist yet.")
    window_start: str = Field(default="", description="Start of the current hour of replacements (RFC 3339).")
    window_replacements: int = Field(default=0, description="Replacements in that hour.")


class JobStatus(Base):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", strict=False)
    phase: Literal["Pending", "Queued", "Running", "Restarting", "Succeeded", "Failed", "Suspended",
                   "InvalidSpec"] = "Pending"
    iteration: int = 0
    weight_version: int = 0
    last_sync_seconds: float | None = None
    reward_mean: float | None = None
    mismatch_kl: float | None = Field(default=None, description="Rollout vs trainer in the latest iteration: the "
                                      "mean k3 of p_trainer / p_rollout over the model's tokens (KL per token).")
    ess: float | None = Field(default=None, description="The normalised effective sample size (sum w)^2 / (n sum "
                              "w^2) of the latest iteration's token ratios p_trainer / p_rollout (1: they agree).")
    staleness_mean: float | None = Field(default=None, description="Weight versions between a trained completion's "
                                         "oldest segment and the update it trained, mean of the latest iteration.")
    rows_refused: int = Field(default=0, description="Dataset rows the trainer left out at start because a picture "
                              "could not be used (missing, unreadable, over dataset.images' limits); each is named "
                              "with its reason in the trainer's log.")
    restarts: int = 0
    preemptions: int = Field(default=0, description="Times Kueue stopped the job's pods (not counted as restarts; "
                             "the restart generation of the pods is restarts + preemptions + suspensions).")
    suspensions: int = Field(default=0, description="Times spec.suspend stopped the pods (the next gang is a new "
                             "restart generation, which resumes from the newest durable copy).")
    progress: ProgressStatus | None = None
    rollout_only_replicas: int = Field(default=0, description="Rollout-only pods of the current gang (/scale).")
    rollout_only_selector: str = Field(default="", description="Label selector of the rollout-only pods (/scale).")
    rollout_replacements: int = Field(default=0, description="Rollout-only pods replaced alone (failed, evicted, "
                                      "deleted or gone), without a gang restart.")
    rollout_pool: RolloutPoolStatus | None = None
    rollout_engines: RolloutEngines | None = None
    eval: EvalStatus | None = None
    message: str = ""
    reason: str = Field(default="", description="Why the job is in its phase, one CamelCase word (the REASON "
                        "column): PodsRunning, PodCreateRefused, ImagePullBackOff, CrashLoopBackOff, "
                        "Unschedulable, ...")
    algorithm: str = Field(default="", description="The algorithm as it runs, its preset expanded (e.g. "
                           "'grpo (preset dapo): policyLoss clip, clip 0.2/0.28, ...').")
    observed_generation: int = 0
    conditions: list[Condition] = Field(default_factory=list)
