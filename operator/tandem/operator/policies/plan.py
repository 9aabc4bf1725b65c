"""The reconcile decision: from what is observed, the next status and the pod actions to take.

Callers: `tandem.operator.runtime.reconcile.run` (which gathers the observation and carries out the plan).
Pure and level-triggered: the same observation always yields the same plan, and carrying out a
plan twice is harmless (creates are create-if-absent, deletes ignore missing pods). This is what
lets the operator restart at any moment and converge without duplicate pods.

`decide` tries the rules of `RULES` in this order. The first rule whose condition holds decides and
ends the pass; a rule marked (+) adds to the plan and lets the rules after it decide. The last rule
always holds.

  invalid_spec    the spec is invalid: InvalidSpec, every pod deleted
  report (+)      a valid job: the expanded algorithm, the driver's progress, the progress block,
                  RolloutsAvailable, MismatchGuard and DurableCheckpoints (and their Events)
  finished        Succeeded or Failed stay (a Failed job keeps no pod)
  succeeded       the driver says done, or every trainer pod Succeeded: Succeeded
  driver_failed   the driver says failed: Failed
  suspended       spec.suspend: Suspended, every pod deleted
  sweep (+)       the job's objects ensured; older gangs' pods and pods past the pool (scaled down) deleted
  restarting      a gang restart under way: wait for the old gang and the backoff, then create the new one
  preempted       Kueue stopped the queued job's pods: Suspended (Preempted)
  refused         a sidecar refused its input (exit 2): Failed at once, no restart could help
  pod_failed      a hybrid pod failed (for a job queued by Kueue, any pod): a gang restart, or Failed
  pool_lost       rollout-only pods lost past `pool_policy.bound` (jobs Kueue does not queue): a gang restart,
                  or Failed
  replace_alone (+)  lost rollout-only pods replaced alone (jobs Kueue does not queue; `pool_policy`)
  stuck           crash loops, image/config waits, unschedulable pods past failurePolicy's limits
                  (`stuck_policy`; rollout-only pods of a running job left out): a gang restart, or Failed
  create_missing (+)  the current gang's missing pods created
  running         every pod Running, or a running job's trainers while its rollout-only pool is short
  requeued        preempted pods wait for Kueue's readmission: still Suspended (condition Queued)
  waiting         Queued while Kueue holds pods at its gate, else Pending

A container's waiting reason or an unschedulable pod shows in the Running or Pending message and in
status.reason. Every pass of a valid job sets condition DurableCheckpoints (whether a gang restart can
resume: checkpointEngine.persist), and the first pass of a job without persist warns (Event
NoDurableCheckpoints). The pods' restart generation is restarts + preemptions + suspensions
(`job_status.gang_generation`): each starts a new gang that resumes from the newest durable copy; only
restarts count against failurePolicy.maxRestarts. `Plan.rules` names the rules that applied.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from tandem.operator.manifests import job_objects, kueue
from tandem.operator.policies import eta, job_status, pool_policy, restart_policy, scale_policy, stuck_policy
from tandem.operator.policies.job_status import Event
from tandem.operator.policies.observe import REFUSED_EXIT, PodState
from tandem.operator.policies.plan_pass import Observation, Pass, Plan
from tandem.spec.models import RLHFJob

__all__ = ["REFUSED", "RULES", "Observation", "Plan", "Rule", "decide"]

REFUSED = "StartRefused"  # status.reason of a job failed because a sidecar refused its input


def _alive(pods: Sequence[PodState]) -> list[str]:
    return sorted(p.name for p in pods if not p.deleting)


def _finish(obs: Observation, plan: Plan, before: str) -> Plan:
    job_status.stamp(plan.status, obs.generation)
    if obs.job is not None:  # the /scale subresource reads these
        gen, first = plan.restart_generation, obs.job.spec.replicas
        plan.status.rollout_only_replicas = len(
            [p for p in obs.pods if p.generation == gen and p.index >= first and not p.deleting])
        plan.status.rollout_only_selector = job_objects.rollout_only_selector(obs.job.metadata.name)
    event = job_status.transition_event(before, plan.status)
    if event is not None:
        plan.events.append(event)
    _containers_waiting(obs, plan)
    return plan


def _containers_waiting(obs: Observation, plan: Plan) -> None:
    """Condition ContainersWaiting from the current gang's containers, and an Event when one starts waiting."""
    new, cond = plan.status, job_status.condition(plan.status, job_status.CONTAINERS_WAITING)
    gen = plan.restart_generation
    waiting = [] if new.phase in job_status.TERMINAL or obs.job is None else [
        i for i in stuck_policy.issues(obs.pods, gen) if i.container]
    if not waiting:
        if cond is not None and cond.status == "True":
            job_status.set_condition(new, job_status.CONTAINERS_WAITING, False, "NoneWaiting", "", obs.now)
        return
    first = waiting[0]
    was = cond.reason if cond is not None and cond.status == "True" else ""
    if not was or not stuck_policy.same_kind(was, first.reason):
        plan.events.append(Event("Warning", first.reason, first.describe()))
    job_status.set_condition(new, job_status.CONTAINERS_WAITING, True, first.reason, first.describe(), obs.now)


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
            plan.events.append(Event("Warning", job_status.NO_DURABLE_CHECKPOINTS, message))
        job_status.set_condition(plan.status, job_status.DURABLE_CHECKPOINTS, False, job_status.NO_DURABLE_CHECKPOINTS,
                             message, now)
        return
    job_status.set_condition(plan.status, job_status.DURABLE_CHECKPOINTS, True, "PersistConfigured",
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


def _gang_failed(p: Pass, what: str, reason: str, decision: str) -> None:
    """Every pod goes (their GPUs with them), but on a restart the running rollout-only pods of a job Kueue does
    not queue: they hold what was learnt (`pool_policy.kept`); then a gang restart, or the job fails."""
    obs, plan, job = p.obs, p.plan, p.job
    new, policy = plan.status, job.spec.failure_policy
    plan.delete, plan.create = _alive(obs.pods), []
    limit = policy.max_restarts
    if decision == "restart":
        kept: list[str] = []
        if not kueue.queue_name(job.metadata.labels):
            kept = pool_policy.kept(obs.pods, job.spec.replicas, job_objects.pod_count(job),
                                    job_status.gang_generation(new))
        plan.delete = [name for name in plan.delete if name not in kept]
        new.restarts += 1
        plan.adopt = kept  # into the new generation (restarts counts in it)
        job_status.set_phase(new, "Restarting", f"gang restart {new.restarts}/{limit}: {what}; {_resumes(job, kept)}",
                         obs.now, reason=reason)
    else:
        why = "failurePolicy.action FailJob" if reason and policy.action == "FailJob" else \
            f"maxRestarts ({limit}) reached"
        job_status.set_phase(new, "Failed", f"{what}; {why}", obs.now, reason=reason)


def _invalid_spec(p: Pass) -> None:
    new, error = p.new, p.obs.spec_error
    message = str(error).split("\n", 1)[-1].strip() if error else "invalid spec"
    if new.phase != "InvalidSpec" or new.message != message:
        job_status.set_phase(new, "InvalidSpec", message, p.obs.now)
    p.plan.delete = _alive(p.obs.pods)


def _report(p: Pass) -> None:
    obs, new, spec, now = p.obs, p.new, p.spec, p.obs.now
    new.algorithm = spec.algorithm.summary(spec.rollout.max_tokens)  # the preset expanded, for all to see
    job_status.apply_progress(new, obs.progress)
    no_rollout = job_status.rollouts_available(new, obs.progress, now)  # the driver waits for a healthy rollout
    if no_rollout is not None:
        p.plan.events.append(no_rollout)
    drift = job_status.mismatch_guard(new, obs.progress, now)  # algorithm.mismatchGuard warned or paused
    if drift is not None:
        p.plan.events.append(drift)
    new.progress = eta.progress_block(new.progress, obs.progress, job_status.gang_generation(new))
    _durability(p.job, p.plan, p.before, now)


def _finished(p: Pass) -> None:
    if p.new.phase == "Failed":
        p.plan.delete = _alive(p.obs.pods)


def _succeeds(p: Pass) -> bool:
    trainers = [pod for pod in p.current if pod.index < p.spec.replicas]
    return p.driver_done or (len(trainers) == p.spec.replicas and all(t.phase == "Succeeded" for t in trainers))


def _succeeded(p: Pass) -> None:
    job_status.set_phase(p.new, "Succeeded", f"finished after {p.new.iteration} iterations", p.obs.now,
                     reason="DriverDone" if p.driver_done else "TrainersSucceeded")
    p.plan.delete = sorted(
        pod.name for pod in p.current if pod.phase not in ("Succeeded", "Failed") and not pod.deleting
    )


def _driver_failed(p: Pass) -> None:
    reason = p.obs.progress.message if p.obs.progress is not None else ""
    job_status.set_phase(p.new, "Failed", f"driver reported failure: {reason or 'no message'}", p.obs.now,
                     reason="DriverFailed")
    p.plan.delete = _alive(p.obs.pods)


def _suspended(p: Pass) -> None:
    new = p.new
    left = _alive(p.obs.pods)
    if new.phase != "Suspended" or job_status.reason_of(new, "Suspended") != "SpecSuspended":
        new.suspensions += 1  # the gang after it is a new generation (fresh pods, stale records ignored)
        job_status.set_phase(new, "Suspended", "suspended: pods deleted", p.obs.now)
    p.plan.delete = left


def _sweep(p: Pass) -> None:
    plan, pods = p.plan, p.obs.pods
    plan.ensure_objects = True
    plan.delete = sorted(pod.name for pod in pods if pod.generation != p.generation and not pod.deleting)
    plan.delete += scale_policy.excess(pods, p.generation, len(p.expected))  # scaled down


def _restarting(p: Pass) -> None:
    new, policy = p.new, p.spec.failure_policy
    wait = restart_policy.backoff_remaining(job_status.restart_began(new), policy.backoff_seconds, p.obs.now)
    if p.stale or wait > 0:
        return
    job_status.set_phase(new, "Pending", f"restart {new.restarts}: creating pods", p.obs.now)
    kept = {pod.name for pod in p.current if not pod.deleting}  # rollout-only pods kept through the restart
    p.plan.create = [i for i, name in enumerate(p.expected) if name not in kept]


def _preempted(p: Pass) -> None:
    plan, new = p.plan, p.new
    plan.delete, plan.create = _alive(p.obs.pods), []
    new.preemptions += 1
    message = (f"preempted by Kueue: {p.preemption}; the pods of generation {p.generation + 1} wait for Kueue to "
               f"admit pod group {kueue.group_name(p.obs.name)} again (queue {p.queue}), then {_resumes(p.job)}")
    job_status.set_phase(new, "Suspended", message, p.obs.now, reason=job_status.PREEMPTED)
    plan.events.append(Event("Warning", job_status.PREEMPTED, message))


def _refused(p: Pass) -> None:  # the same input would be refused by every new gang: fail now, free the GPUs
    assert p.refused is not None
    p.plan.delete, p.plan.create = _alive(p.obs.pods), []
    job_status.set_phase(p.new, "Failed", f"pod {p.refused.name} {p.refused.refused} (a sidecar refused its input: "
                         f"exit {REFUSED_EXIT}; fix the spec or files it names, then create the job again)", p.obs.now,
                         reason=REFUSED)


def _pod_failed(p: Pass) -> None:
    what = "; ".join(f.describe() for f in p.failures)
    _gang_failed(p, what, "", restart_policy.on_failure(p.new.restarts, p.spec.failure_policy.max_restarts))


def _pool_lost(p: Pass) -> None:
    policy = p.spec.failure_policy
    p.new.rollout_pool = None
    decision = stuck_policy.on_verdict(policy.action, p.new.restarts, policy.max_restarts)
    _gang_failed(p, p.pool.verdict, pool_policy.LIMIT, decision)


def _stuck(p: Pass) -> None:
    policy, stuck = p.spec.failure_policy, p.stuck
    assert stuck is not None
    _gang_failed(p, stuck.message, stuck.reason, stuck_policy.on_verdict(policy.action, p.new.restarts,
                                                                        policy.max_restarts))


def _create_missing(p: Pass) -> None:
    present = {pod.name for pod in p.obs.pods}  # an old-generation pod of the same name must go first
    p.plan.create = [i for i, name in enumerate(p.expected) if name not in present]


def _note(p: Pass) -> tuple[str, str]:
    """The first issue of the current gang: for the phase message, and the reason it gives."""
    return (f"; {p.issue.describe()}", p.issue.reason) if p.issue else ("", "")


def _runs(p: Pass) -> bool:
    return p.all_running or (p.new.phase == "Running" and not p.stale
                             and scale_policy.trainers_running(p.obs.pods, p.generation, p.spec.replicas))


def _running(p: Pass) -> None:
    new, spec = p.new, p.spec
    (note, why), message = _note(p), f"{len(p.expected)} pods running"
    if not p.all_running:  # the rollout-only pool is short: still growing, or a lost pod being replaced
        up = scale_policy.pool_running(p.obs.pods, p.generation, spec.replicas)
        message = f"{spec.replicas} hybrid pods running; rollout-only pool {up}/{spec.rollout_only_replicas}"
        gone = pool_policy.replacing(new.rollout_pool)
        message += f" (replacing {', '.join(gone)})" if gone else ""
        why = why or pool_policy.SHORT
    if new.phase != "Running" or new.message != message + note:
        job_status.set_phase(new, "Running", message + note, p.obs.now, reason=why)


def _group(p: Pass) -> str:
    return f"pod group {kueue.group_name(p.obs.name)} (queue {p.queue})"


def _requeues(p: Pass) -> bool:
    return p.new.phase == "Suspended" and job_status.reason_of(p.new, "Suspended") == job_status.PREEMPTED


def _requeued(p: Pass) -> None:
    if p.held:  # the replacement pods wait for re-admission: still Suspended, and queued
        job_status.set_condition(p.new, "Queued", True, job_status.REASONS["Queued"],
                             f"{len(p.held)} of {len(p.expected)} pods wait for Kueue to admit {_group(p)}", p.obs.now)


def _waiting(p: Pass) -> None:
    new, expected = p.new, p.expected
    note, why = _note(p)
    if p.held:
        message = f"waiting for Kueue to admit {_group(p)}: {len(p.held)} of {len(expected)} pods gated"
        phase: job_status.Phase = "Queued"
    else:
        waiting = len([pod for pod in p.current if pod.phase != "Running"]) + len(p.plan.create)
        message, phase = f"waiting for {waiting} of {len(expected)} pods{note}", "Pending"
    if new.phase != phase or new.message != message or not new.conditions:
        job_status.set_phase(new, phase, message, p.obs.now, reason=why if phase == "Pending" else "")


@dataclass(frozen=True)
class Rule:
    """One row of the decision: when it applies (`when`), what it does to the plan (`then`); a rule that
    `goes_on` adds to the plan and lets the rules after it decide, any other ends the pass."""

    name: str
    when: Callable[[Pass], bool]
    then: Callable[[Pass], None]
    goes_on: bool = False


def _always(p: Pass) -> bool:
    return True


RULES: tuple[Rule, ...] = (  # in the order of the module's docstring
    Rule("invalid_spec", lambda p: p.obs.job is None, _invalid_spec),
    Rule("report", _always, _report, goes_on=True),
    Rule("finished", lambda p: p.new.phase in job_status.TERMINAL, _finished),
    Rule("succeeded", _succeeds, _succeeded),
    Rule("driver_failed", lambda p: p.obs.progress is not None and p.obs.progress.phase == "failed", _driver_failed),
    Rule("suspended", lambda p: p.spec.suspend, _suspended),
    Rule("sweep", _always, _sweep, goes_on=True),
    Rule("restarting", lambda p: p.new.phase == "Restarting", _restarting),
    Rule("preempted", lambda p: bool(p.preemption), _preempted),
    Rule("refused", lambda p: p.refused is not None, _refused),
    Rule("pod_failed", lambda p: bool(p.failures), _pod_failed),
    Rule("pool_lost", lambda p: not p.queue and bool(p.pool.verdict), _pool_lost),
    Rule("replace_alone", lambda p: not p.queue, lambda p: _replace_alone(p.plan, p.pool), goes_on=True),
    Rule("stuck", lambda p: p.stuck is not None, _stuck),
    Rule("create_missing", _always, _create_missing, goes_on=True),
    Rule("running", _runs, _running),
    Rule("requeued", _requeues, _requeued),
    Rule("waiting", _always, _waiting),
)


def decide(obs: Observation) -> Plan:
    """The rules of `RULES` in order: each that applies acts on the plan; the first that does not go on ends it."""
    p = Pass(obs)
    for rule in RULES:
        if rule.when(p):
            p.plan.rules.append(rule.name)
            rule.then(p)
            if not rule.goes_on:
                break
    return _finish(obs, p.plan, p.before)
