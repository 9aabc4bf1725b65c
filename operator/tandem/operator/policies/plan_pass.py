"""One decision under way: the observation it starts from, the plan it builds, and the facts its rules derive.

Callers: `tandem.operator.policies.plan` (whose rules read a `Pass` and write its `Plan`; `Observation` and `Plan`
are re-exported there) and `tandem.operator.runtime.reconcile.run` (which gathers the `Observation` and carries out
the `Plan`). Pure: nothing here reads the clock, the API server or etcd.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property

from tandem.operator.manifests import job_objects, kueue
from tandem.operator.policies import (
    admission_policy,
    job_status,
    pool_policy,
    restart_policy,
    scale_policy,
    stuck_policy,
)
from tandem.operator.policies.job_status import Event
from tandem.operator.policies.observe import PodState
from tandem.operator.policies.restart_policy import Failure
from tandem.spec.load import SpecError
from tandem.spec.models import JobSpec, RLHFJob
from tandem.spec.progress import Progress
from tandem.spec.status import JobStatus


@dataclass(frozen=True)
class Observation:
    name: str
    generation: int  # metadata.generation
    job: RLHFJob | None  # None when the spec is invalid
    spec_error: SpecError | None
    status: JobStatus
    pods: Sequence[PodState]
    progress: Progress | None
    now: datetime
    # pods this operator created (the API server answered 201) and has not deleted since, by name: the
    # gang generation created in (`reconcile.JobMemory.created`); a rollout-only pod among them that is
    # gone was lost, though no pass saw it (`pool_policy`)
    created: Mapping[str, int] = field(default_factory=dict)


@dataclass
class Plan:
    status: JobStatus
    create: list[int] = field(default_factory=list)  # pod indices to create (current generation)
    delete: list[str] = field(default_factory=list)  # pod names to delete
    adopt: list[str] = field(default_factory=list)  # pods relabelled into the restart generation (kept pods)
    ensure_objects: bool = False  # Service, ConfigMap, Secret must exist
    events: list[Event] = field(default_factory=list)
    rules: list[str] = field(default_factory=list)  # the rules of `plan.RULES` that applied, in order

    @property
    def restart_generation(self) -> int:
        return job_status.gang_generation(self.status)


class Pass:
    """One decision under way: the observation, the plan being built, and the facts the rules derive from them.

    A fact is computed once, when a rule first asks for it; the rules run in their order, so that is always
    the same point of the pass. Those after `invalid_spec` assume a valid job."""

    def __init__(self, obs: Observation) -> None:
        self.obs = obs
        self.plan = Plan(status=obs.status.model_copy(deep=True))
        self.before = obs.status.phase if obs.status.conditions else "New"  # never reconciled yet: announce it

    @property
    def new(self) -> JobStatus:
        return self.plan.status

    @property
    def job(self) -> RLHFJob:
        assert self.obs.job is not None, "a rule after invalid_spec"
        return self.obs.job

    @property
    def spec(self) -> JobSpec:
        return self.job.spec

    @cached_property
    def generation(self) -> int:
        return job_status.gang_generation(self.new)

    @cached_property
    def expected(self) -> list[str]:
        return job_objects.pod_names(self.job, self.generation)

    @cached_property
    def current(self) -> list[PodState]:
        return [p for p in self.obs.pods if p.generation == self.generation]

    @cached_property
    def driver_done(self) -> bool:
        return self.obs.progress is not None and self.obs.progress.phase == "done"

    @cached_property
    def stale(self) -> list[str]:
        return restart_policy.old_generation_left(self.obs.pods, self.generation)

    @cached_property
    def known(self) -> list[str]:  # scaled up: new
        return scale_policy.known(self.expected, self.spec.replicas, self.obs.status.rollout_only_replicas)

    @cached_property
    def queue(self) -> str:
        return kueue.queue_name(self.job.metadata.labels)

    @cached_property
    def preemption(self) -> str | None:
        return self.queue and admission_policy.preemption(self.obs.pods, self.known, self.generation,
                                                          all_were_running=self.new.phase == "Running")

    @cached_property
    def refused(self) -> PodState | None:
        return next((p for p in self.current if p.refused and not p.deleting), None)

    @cached_property
    def was_running(self) -> bool:
        return self.new.phase == "Running"

    @cached_property
    def failures(self) -> list[Failure]:
        gang = self.known if self.queue else self.known[:self.spec.replicas]  # hybrids: known
        found = restart_policy.failures(self.obs.pods, gang, self.generation, all_were_running=self.was_running)
        if self.queue:  # Kueue's pod groups neither shrink nor free a failed pod's name before its replacement exists
            found += restart_policy.failures(self.obs.pods, self.expected[len(self.known):], self.generation,
                                             all_were_running=False)
        return found

    @cached_property
    def pool(self) -> pool_policy.Replacement:
        spec, policy = self.spec, self.spec.failure_policy
        made = [name for name, gen in self.obs.created.items() if gen == self.generation]
        existed = scale_policy.known(self.expected, spec.replicas, self.obs.status.rollout_only_replicas, created=made)
        return pool_policy.replace(self.obs.pods, self.expected[spec.replicas:], existed[spec.replicas:],
                                   self.generation, record=self.new.rollout_pool, now=self.obs.now,
                                   limit=pool_policy.bound(policy.max_restarts, spec.rollout_only_replicas))

    @cached_property
    def stuck(self) -> stuck_policy.Verdict | None:
        gang_pods = pool_policy.gang_view(self.obs.pods, self.spec.replicas, self.generation,
                                          job_running=self.was_running and not self.queue)
        return stuck_policy.verdict(gang_pods, self.generation, self.spec.failure_policy,
                                    waiting_since=job_status.waiting_since(self.new), now=self.obs.now)

    @property
    def all_running(self) -> bool:  # after create_missing
        return (not self.plan.create and all(p.phase == "Running" and not p.deleting for p in self.current)
                and not self.stale)

    @cached_property
    def issue(self) -> stuck_policy.Issue | None:
        return next(iter(stuck_policy.issues(self.obs.pods, self.generation)), None)

    @cached_property
    def held(self) -> list[str]:
        return admission_policy.gated(self.obs.pods, self.generation) if self.queue else []
