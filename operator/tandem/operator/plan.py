"""The reconcile decision: from what is observed, the next status and the pod actions to take.

Callers: `tandem.operator.reconcile.run` (which gathers the observation and carries out the plan).
Pure and level-triggered: the same observation always yields the same plan, and carrying out a
plan twice is harmless (creates are create-if-absent, deletes ignore missing pods). This is what
lets the operator restart at any moment and converge without duplicate pods.

Order of precedence: invalid spec > finished (Succeeded/Failed stay) > driver says done/failed >
suspend > restart in progress > Kueue preemption (queued jobs) > a sidecar that refused its input
(exit 2: Failed at once, no restart could help) > hybrid pod failures (a gang restart; for a job queued
by Kueue, any pod's) > a lost rollout-only pod (`pool_policy`: replaced alone, or a stuck pool past its
bound) > a stuck gang (`stuck_policy`: crash loops, image/config waits, unschedulable pods past
failurePolicy's limits; rollout-only pods of a running job left out) > create what is missing (then
Running, also while the rollout-only pool is short, Queued while Kueue holds pods at its gate, or
Pending; a container's waiting reason or an unschedulable pod shows in the message and status.reason).
Every pass of a valid job also sets condition DurableCheckpoints (whether a gang restart can resume:
checkpointEngine.persist), and the first pass of a job without persist warns (Event NoDurableCheckpoints).
The pods' restart generation is restarts + preemptions + suspensions (`status.gang_generation`): each
starts a new gang that resumes from the newest durable copy; only restarts count against
failurePolicy.maxRestarts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from tandem.operator import (
    admission_policy,
    builders,
    eta,
    kueue,
    pool_policy,
    restart_policy,
    scale_policy,
    status,
    stuck_policy,
)
from tandem.operator.observe import REFUSED_EXIT, PodState
from tandem.operator.status import Event
from tandem.spec.load import SpecError
from tandem.spec.models import JobStatus, RLHFJob
from tandem.spec.progress import Progress

REFUSED = "StartRefused"  # status.reason of a job failed because a sidecar refused its input


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

    @property
    def restart_generation(self) -> int:
        return status.gang_generation(self.status)


def _alive(pods: Sequence[PodState]) -> list[str]:
    return sorted(p.name for p in pods if not p.deleting)


def _expected(job: RLHFJob, generation: int) -> list[str]:
    return builders.pod_names(job, generation)


def _finish(obs: Observation, plan: Plan, before: str) -> Plan:
    status.stamp(plan.status, obs.generation)
    if obs.job is not None:  # the /scale subresource reads these
        gen, first = plan.restart_generation, obs.job.spec.replicas
        plan.status.rollout_only_replicas = len(
            [p for p in obs.pods if p.generation == gen and p.index >= first and not p.deleting])
        plan.status.rollout_only_selector = builders.rollout_only_selector(obs.job.metadata.name)
    event = status.transition_event(before, plan.status)
    if event is not None:
        plan.events.append(event)
    _containers_waiting(obs, plan)
    return plan


def _containers_waiting(obs: Observation, plan: Plan) -> None:
    """Condition ContainersWaiting from the current gang's containers, and an Event when one starts waiting."""
    new, cond = plan.status, status.condition(plan.status, status.CONTAINERS_WAITING)
    gen = plan.restart_generation
    waiting = [] if new.phase in status.TERMINAL or obs.job is None else [
        i for i in stuck_policy.issues(obs.pods, gen) if i.container]
    if not waiting:
        if cond is not None and cond.status == "True":
            status.set_condition(new, status.CONTAINERS_WAITING, False, "NoneWaiting", "", obs.now)
        return
    first = waiting[0]
    was = cond.reason if cond is not None and cond.status == "True" else ""
    if not was or not stuck_policy.same_kind(was, first.reason):
        plan.events.append(Event("Warning", first.reason, first.describe()))
    status.set_condition(new, status.CONTAINERS_WAITING, True, first.reason, first.describe(), obs.now)


def _resumes(job: RLHFJob, kept: Sequence[str] = ()) -> str:
    """Where a restarted gang's driver continues from (the hybrid pods' shared memory goes with them)."""
    if job.spec.checkpoint_engine.persist is not None:
        return "resuming from the newest durable copy in checkpointEngine.persist.path"
    if kept:
        return (f"resuming from the newest version the kept rollout-only pods ({', '.join(kept)}) hold (no "
                "checkpointEngine.persist)")
    return ("no checkpointEngine.persist and no running rollout-only pod to keep, so training starts over from "
            "the initial model at iteration 0 (the published versions were in the deleted pods' shared memory)")


def _durability(job: RLHFJob, plan: Plan, before: str, now: datetime) -> None:
    """Condition DurableCheckpoints, and at creation a warning when a gang restart would lose everything."""
    persist = job.spec.checkpoint_engine.persist
    if persist is None:
        kept = ("resumes from the newest version the rollout-only pods hold (they are kept through it), and only "
                "if none is running " if job.spec.rollout_only_replicas else "")
        message = (f"checkpointEngine.persist is not set: a gang restart (a hybrid pod failed, evicted or lost) "
                   f"{kept}starts training over from the initial model at iteration 0; set it to a directory "
                   "on a writable volume to resume from the newest durable copy")
        if before == "New":
            plan.events.append(Event("Warning", status.NO_DURABLE_CHECKPOINTS, message))
        status.set_condition(plan.status, status.DURABLE_CHECKPOINTS, False, status.NO_DURABLE_CHECKPOINTS,
                             message, now)
        return
    status.set_condition(plan.status, status.DURABLE_CHECKPOINTS, True, "PersistConfigured",
                         f"a gang restart resumes from the newest durable copy in {persist.path} (one every "
                         f"{persist.every} iterations, and the last)", now)


def _replace_alone(plan: Plan, pool: pool_policy.Replacement) -> None:
    """Lost rollout-only pods go (Failed ones deleted) and come back under their names: counted once each."""
    new = plan.status
    new.rollout_pool = pool.record
    plan.delete = sorted(set(plan.delete) | set(pool.delete))
    for loss in pool.lost:
        new.rollout_replacements += 1
        plan.events.append(Event("Warning", pool_policy.REPLACED, f"{loss.describe()}: replacing it alone, no gang "
                                 f"restart ({new.rollout_replacements} replaced so far)"))


def _gang_failed(obs: Observation, job: RLHFJob, plan: Plan, before: str, what: str, reason: str,
                 decision: str) -> Plan:
    """Every pod goes (their GPUs with them), but on a restart the running rollout-only pods of a job Kueue does
    not queue: they hold what was learnt (`pool_policy.kept`); then a gang restart, or the job fails."""
    new, policy = plan.status, job.spec.failure_policy
    plan.delete, plan.create = _alive(obs.pods), []
    limit = policy.max_restarts
    if decision == "restart":
        kept: list[str] = []
        if not kueue.queue_name(job.metadata.labels):
            kept = pool_policy.kept(obs.pods, job.spec.replicas, builders.pod_count(job), status.gang_generation(new))
        plan.delete = [name for name in plan.delete if name not in kept]
        new.restarts += 1
        plan.adopt = kept  # into the new generation (restarts counts in it)
        status.set_phase(new, "Restarting", f"gang restart {new.restarts}/{limit}: {what}; {_resumes(job, kept)}",
                         obs.now, reason=reason)
    else:
        why = "failurePolicy.action FailJob" if reason and policy.action == "FailJob" else \
            f"maxRestarts ({limit}) reached"
        status.set_phase(new, "Failed", f"{what}; {why}", obs.now, reason=reason)
    return _finish(obs, plan, before)


def decide(obs: Observation) -> Plan:
    new = obs.status.model_copy(deep=True)
    before = obs.status.phase if obs.status.conditions else "New"  # never reconciled yet: announce it
    plan = Plan(status=new)
    now = obs.now

    if obs.job is None:
        message = str(obs.spec_error).split("\n", 1)[-1].strip() if obs.spec_error else "invalid spec"
        if new.phase != "InvalidSpec" or new.message != message:
            status.set_phase(new, "InvalidSpec", message, now)
        plan.delete = _alive(obs.pods)
        return _finish(obs, plan, before)

    spec = obs.job.spec
    new.algorithm = spec.algorithm.summary(spec.rollout.max_tokens)  # the preset expanded, for all to see
    status.apply_progress(new, obs.progress)
    no_rollout = status.rollouts_available(new, obs.progress, now)  # the driver waits for a healthy rollout
    if no_rollout is not None:
        plan.events.append(no_rollout)
    drift = status.mismatch_guard(new, obs.progress, now)  # algorithm.mismatchGuard warned or paused
    if drift is not None:
        plan.events.append(drift)
    new.progress = eta.progress_block(new.progress, obs.progress, status.gang_generation(new))
    _durability(obs.job, plan, before, now)

    if new.phase in status.TERMINAL:
        if new.phase == "Failed":
            plan.delete = _alive(obs.pods)
        return _finish(obs, plan, before)

    generation = status.gang_generation(new)
    expected = _expected(obs.job, generation)
    current = [p for p in obs.pods if p.generation == generation]
    trainers = [p for p in current if p.index < spec.replicas]

    driver_done = obs.progress is not None and obs.progress.phase == "done"
    if driver_done or (len(trainers) == spec.replicas and all(p.phase == "Succeeded" for p in trainers)):
        status.set_phase(new, "Succeeded", f"finished after {new.iteration} iterations", now,
                         reason="DriverDone" if driver_done else "TrainersSucceeded")
        plan.delete = sorted(
            p.name for p in current if p.phase not in ("Succeeded", "Failed") and not p.deleting
        )
        return _finish(obs, plan, before)
    if obs.progress is not None and obs.progress.phase == "failed":
        reason = obs.progress.message or "no message"
        status.set_phase(new, "Failed", f"driver reported failure: {reason}", now, reason="DriverFailed")
        plan.delete = _alive(obs.pods)
        return _finish(obs, plan, before)

    if spec.suspend:
        left = _alive(obs.pods)
        if new.phase != "Suspended" or status.reason_of(new, "Suspended") != "SpecSuspended":
            new.suspensions += 1  # the gang after it is a new generation (fresh pods, stale records ignored)
            status.set_phase(new, "Suspended", "suspended: pods deleted", now)
        plan.delete = left
        return _finish(obs, plan, before)

    plan.ensure_objects = True
    stale = restart_policy.old_generation_left(obs.pods, generation)
    plan.delete = sorted(p.name for p in obs.pods if p.generation != generation and not p.deleting)
    plan.delete += scale_policy.excess(obs.pods, generation, len(expected))  # scaled down
    known = scale_policy.known(expected, spec.replicas, obs.status.rollout_only_replicas)  # scaled up: new

    if new.phase == "Restarting":
        policy = spec.failure_policy
        wait = restart_policy.backoff_remaining(status.restart_began(new), policy.backoff_seconds, now)
        if stale or wait > 0:
            return _finish(obs, plan, before)
        status.set_phase(new, "Pending", f"restart {new.restarts}: creating pods", now)
        kept = {p.name for p in current if not p.deleting}  # rollout-only pods kept through the restart
        plan.create = [i for i, name in enumerate(expected) if name not in kept]
        return _finish(obs, plan, before)

    queue = kueue.queue_name(obs.job.metadata.labels)
    why = queue and admission_policy.preemption(obs.pods, known, generation,
                                                all_were_running=new.phase == "Running")
    if why:
        plan.delete, plan.create = _alive(obs.pods), []
        new.preemptions += 1
        message = (f"preempted by Kueue: {why}; the pods of generation {generation + 1} wait for Kueue to admit "
                   f"pod group {kueue.group_name(obs.name)} again (queue {queue}), then {_resumes(obs.job)}")
        status.set_phase(new, "Suspended", message, now, reason=status.PREEMPTED)
        plan.events.append(Event("Warning", status.PREEMPTED, message))
        return _finish(obs, plan, before)

    refused = next((p for p in current if p.refused and not p.deleting), None)
    if refused is not None:  # the same input would be refused by every new gang: fail now, free the GPUs
        plan.delete, plan.create = _alive(obs.pods), []
        status.set_phase(new, "Failed", f"pod {refused.name} {refused.refused} (a sidecar refused its input: exit "
                         f"{REFUSED_EXIT}; fix the spec or files it names, then create the job again)", now,
                         reason=REFUSED)
        return _finish(obs, plan, before)
    was_running, gang = new.phase == "Running", known if queue else known[:spec.replicas]  # hybrids: known
    found = restart_policy.failures(obs.pods, gang, generation, all_were_running=was_running)
    if queue:  # Kueue's pod groups neither shrink nor free a failed pod's name before its replacement exists
        found += restart_policy.failures(obs.pods, expected[len(known):], generation, all_were_running=False)
    policy = spec.failure_policy
    if found:
        what = "; ".join(f.describe() for f in found)
        decision = restart_policy.on_failure(new.restarts, policy.max_restarts)
        return _gang_failed(obs, obs.job, plan, before, what, "", decision)
    if not queue:
        made = [name for name, gen in obs.created.items() if gen == generation]
        existed = scale_policy.known(expected, spec.replicas, obs.status.rollout_only_replicas, created=made)
        pool = pool_policy.replace(obs.pods, expected[spec.replicas:], existed[spec.replicas:], generation,
                                   record=new.rollout_pool, now=now,
                                   limit=pool_policy.bound(policy.max_restarts, spec.rollout_only_replicas))
        if pool.verdict:
            new.rollout_pool = None
            decision = stuck_policy.on_verdict(policy.action, new.restarts, policy.max_restarts)
            return _gang_failed(obs, obs.job, plan, before, pool.verdict, pool_policy.LIMIT, decision)
        _replace_alone(plan, pool)
    gang_pods = pool_policy.gang_view(obs.pods, spec.replicas, generation, job_running=was_running and not queue)
    stuck = stuck_policy.verdict(gang_pods, generation, policy, waiting_since=status.waiting_since(new), now=now)
    if stuck is not None:
        decision = stuck_policy.on_verdict(policy.action, new.restarts, policy.max_restarts)
        return _gang_failed(obs, obs.job, plan, before, stuck.message, stuck.reason, decision)

    present = {p.name for p in obs.pods}  # an old-generation pod of the same name must go first
    plan.create = [i for i, name in enumerate(expected) if name not in present]
    running = not plan.create and all(p.phase == "Running" and not p.deleting for p in current) and not stale
    issue = next(iter(stuck_policy.issues(obs.pods, generation)), None)
    note, why = (f"; {issue.describe()}", issue.reason) if issue else ("", "")
    if running or (new.phase == "Running" and not stale
                   and scale_policy.trainers_running(obs.pods, generation, spec.replicas)):
        message = f"{len(expected)} pods running"
        if not running:  # the rollout-only pool is short: still growing, or a lost pod being replaced
            up = scale_policy.pool_running(obs.pods, generation, spec.replicas)
            message = f"{spec.replicas} hybrid pods running; rollout-only pool {up}/{spec.rollout_only_replicas}"
            gone = pool_policy.replacing(new.rollout_pool)
            message += f" (replacing {', '.join(gone)})" if gone else ""
            why = why or pool_policy.SHORT
        if new.phase != "Running" or new.message != message + note:
            status.set_phase(new, "Running", message + note, now, reason=why)
        return _finish(obs, plan, before)
    held = admission_policy.gated(obs.pods, generation) if queue else []
    group = f"pod group {kueue.group_name(obs.name)} (queue {queue})"
    if new.phase == "Suspended" and status.reason_of(new, "Suspended") == status.PREEMPTED:
        if held:  # the replacement pods wait for re-admission: still Suspended, and queued
            status.set_condition(new, "Queued", True, status.REASONS["Queued"],
                                 f"{len(held)} of {len(expected)} pods wait for Kueue to admit {group}", now)
        return _finish(obs, plan, before)
    if held:
        message = f"waiting for Kueue to admit {group}: {len(held)} of {len(expected)} pods gated"
        phase: status.Phase = "Queued"
    else:
        waiting = len([p for p in current if p.phase != "Running"]) + len(plan.create)
        message, phase = f"waiting for {waiting} of {len(expected)} pods{note}", "Pending"
    if new.phase != phase or new.message != message or not new.conditions:
        status.set_phase(new, phase, message, now, reason=why if phase == "Pending" else "")
    return _finish(obs, plan, before)
