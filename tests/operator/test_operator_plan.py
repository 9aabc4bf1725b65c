"""Table-driven tests of the pure reconcile decision, status conditions and the restart policy."""

from __future__ import annotations

from datetime import datetime

import pytest
from wrappers import T0, JobWrapper, PodWrapper, StatusWrapper, later, pods

from tandem.operator.policies import job_status, restart_policy
from tandem.operator.policies.observe import PodState, pod_state
from tandem.operator.policies.plan import Observation, Plan, decide
from tandem.spec.load import SpecError, parse_job
from tandem.spec.progress import EvalSummary, Progress
from tandem.spec.status import JobStatus


def observe(
    job: JobWrapper,
    st: JobStatus | None = None,
    pod_list: list[PodState] | None = None,
    progress: Progress | None = None,
    now: datetime = T0,
) -> Observation:
    doc = job.obj()
    try:
        parsed, error = parse_job(doc), None
    except SpecError as e:
        parsed, error = None, e
    return Observation(
        name=doc["metadata"]["name"],
        generation=1,
        job=parsed,
        spec_error=error,
        status=st or JobStatus(),
        pods=pod_list or [],
        progress=progress,
        now=now,
    )


def test_new_job_creates_every_pod_and_announces_pending() -> None:
    plan = decide(observe(JobWrapper().replicas(2).rollout_only(1)))
    assert plan.create == [0, 1, 2] and plan.delete == [] and plan.ensure_objects
    assert plan.status.phase == "Pending" and plan.status.observed_generation == 1
    # no checkpointEngine.persist: the job warns once, at creation, what a gang restart would cost
    assert [(e.type, e.reason) for e in plan.events] == [("Warning", "NoDurableCheckpoints"), ("Normal", "Pending")]
    conds = {c.type: c.status for c in plan.status.conditions}
    assert conds == {
        "SpecValid": "True",
        "Queued": "False",
        "Ready": "False",
        "Restarting": "False",
        "Suspended": "False",
        "Complete": "False",
        "Failed": "False",
        "DurableCheckpoints": "False",
    }


def test_a_sidecar_refusing_its_input_fails_the_job_at_once_without_a_restart() -> None:
    job = JobWrapper().replicas(2).failure_policy(3)
    running = StatusWrapper().phase("Running").get()
    plan = decide(observe(job, running, [PodWrapper("demo", 0, replicas=2).running().state(),
                                         PodWrapper("demo", 1, replicas=2).refused().state()]))
    assert plan.status.phase == "Failed" and plan.status.restarts == 0 and plan.status.reason == "StartRefused"
    assert "pod demo-1 trainer: spec.model.path: /models/x/config.json: missing" in plan.status.message
    assert plan.delete == ["demo-0", "demo-1"] and plan.create == []


def test_a_refusal_is_read_from_the_container_that_exited_2() -> None:
    pod = {"metadata": {"name": "demo-0", "labels": {"tandem.dev/job": "demo", "tandem.dev/index": "0",
                                                       "tandem.dev/restart-generation": "0"}},
           "status": {"phase": "Running", "containerStatuses": [
               {"name": "trainer", "state": {"waiting": {"reason": "CrashLoopBackOff"}}, "restartCount": 1,
                "lastState": {"terminated": {"exitCode": 2, "message": "traceback...\nrow 7 of /data/x.jsonl: "
                                                                       "612 tokens, the limit is 512"}}},
               {"name": "rollout", "state": {"terminated": {"exitCode": 1, "message": "boom"}}}]}}
    state = pod_state(pod)
    assert state is not None and state.refused == "trainer: row 7 of /data/x.jsonl: 612 tokens, the limit is 512"
    pod["status"]["containerStatuses"][0]["lastState"]["terminated"]["exitCode"] = 1
    state = pod_state(pod)
    assert state is not None and state.refused == ""  # an ordinary crash: the restart policy's


def test_the_status_shows_the_algorithm_with_its_preset_expanded() -> None:
    job = JobWrapper().set("algorithm.preset", "gspo").set("rollout.maxTokens", 256)
    shown = decide(observe(job)).status.algorithm
    assert shown.startswith("grpo (preset gspo): policyLoss gspo, clip 0.0003/0.0004")
    assert "lossAgg seq-mean-token-mean" in shown and "klCoef 0" in shown


@pytest.mark.parametrize(
    ("phases", "expected_phase", "create"),
    [
        (["Running", "Running"], "Running", []),
        (["Running", "Pending"], "Pending", []),
        (["Running"], "Pending", [1]),
        ([], "Pending", [0, 1]),
    ],
)
def test_pending_until_every_pod_runs(phases: list[str], expected_phase: str, create: list[int]) -> None:
    pod_list = [PodWrapper("demo", i).phase(p).state() for i, p in enumerate(phases)]
    plan = decide(observe(JobWrapper().replicas(2), StatusWrapper().phase("Pending").get(), pod_list))
    assert plan.status.phase == expected_phase and plan.create == create and plan.delete == []


@pytest.mark.parametrize(
    ("pod_list", "phase_before", "why"),
    [
        (
            [PodWrapper("demo", 0).running().state(), PodWrapper("demo", 1).failed("OOMKilled").state()],
            "Running",
            "pod demo-1 failed (OOMKilled)",
        ),
        (
            [PodWrapper("demo", 0).failed().state(), PodWrapper("demo", 1).phase("Pending").state()],
            "Pending",
            "pod demo-0 failed (Error)",
        ),
        ([PodWrapper("demo", 0).running().state()], "Running", "pod demo-1 disappeared"),
        (
            [PodWrapper("demo", 0).running().state(), PodWrapper("demo", 1).running().deleting().state()],
            "Running",
            "pod demo-1 is being deleted",
        ),
    ],
)
def test_a_failed_pod_restarts_the_whole_gang(pod_list: list[PodState], phase_before: str, why: str) -> None:
    job = JobWrapper().replicas(2).failure_policy(3, 10)
    plan = decide(observe(job, StatusWrapper().phase(phase_before).get(), pod_list))
    assert plan.status.phase == "Restarting" and plan.status.restarts == 1
    assert plan.delete == sorted(p.name for p in pod_list if not p.deleting) and plan.create == []
    assert why in plan.status.message and "gang restart 1/3" in plan.status.message
    assert "starts over from the initial model" in plan.status.message  # no durable copies configured
    assert [(e.type, e.reason) for e in plan.events] == [("Warning", "Restarting")]
    assert job_status.restart_began(plan.status) == T0


def test_a_restart_says_it_resumes_when_durable_copies_are_kept() -> None:
    job = (JobWrapper().replicas(2).failure_policy(3, 10)
           .set("volumes", [{"name": "ckpt", "mountPath": "/ckpt", "claimName": "ckpt"}])
           .set("checkpointEngine.persist", {"path": "/ckpt/t"}))
    failed = [PodWrapper("demo", 0).failed().state(), PodWrapper("demo", 1).running().state()]
    plan = decide(observe(job, StatusWrapper().phase("Running").get(), failed))
    assert plan.status.phase == "Restarting"
    assert "resuming from the newest durable copy" in plan.status.message
    assert plan.status.message in plan.events[0].message  # the Warning event carries it too


def test_pod_missing_while_pending_is_recreated_not_a_failure() -> None:
    plan = decide(
        observe(
            JobWrapper().replicas(2),
            StatusWrapper().phase("Pending").get(),
            [PodWrapper("demo", 0).running().state()],
        )
    )
    assert plan.status.phase == "Pending" and plan.create == [1] and plan.status.restarts == 0


@pytest.mark.parametrize(
    ("pod_list", "now", "create", "phase"),
    [
        (pods("demo", 2, phase="Running", generation=0), later(60), [], "Restarting"),  # old gang still there
        (
            [PodWrapper("demo", 0).running().deleting().state()],
            later(60),
            [],
            "Restarting",
        ),  # still terminating
        ([], later(5), [], "Restarting"),  # backoff not elapsed
        ([], later(10), [0, 1], "Pending"),  # backoff elapsed
    ],
)
def test_restart_waits_for_old_gang_and_backoff(
    pod_list: list[PodState], now: datetime, create: list[int], phase: str
) -> None:
    st = StatusWrapper().restarts(1).restart_began(T0).get()
    plan = decide(observe(JobWrapper().replicas(2).failure_policy(3, 10), st, pod_list, now=now))
    assert plan.create == create and plan.status.phase == phase and plan.restart_generation == 1
    assert plan.delete == sorted(p.name for p in pod_list if not p.deleting)


def test_new_generation_pods_count_and_old_ones_are_deleted() -> None:
    st = StatusWrapper().phase("Pending").restarts(1).get()
    pod_list = [
        PodWrapper("demo", 0).running().generation(1).state(),
        PodWrapper("demo", 1).running().generation(0).state(),
    ]
    plan = decide(observe(JobWrapper().replicas(2), st, pod_list))
    assert plan.delete == ["demo-1"] and plan.create == [] and plan.status.phase == "Pending"


@pytest.mark.parametrize(
    ("restarts", "max_restarts", "phase"), [(0, 0, "Failed"), (2, 3, "Restarting"), (3, 3, "Failed")]
)
def test_max_restarts_then_failed(restarts: int, max_restarts: int, phase: str) -> None:
    st = StatusWrapper().phase("Running").restarts(restarts).get()
    pod_list = [PodWrapper("demo", 0).failed().generation(restarts).state()]
    plan = decide(observe(JobWrapper().failure_policy(max_restarts), st, pod_list))
    assert plan.status.phase == phase and plan.delete == ["demo-0"]
    assert plan.status.restarts == (restarts + 1 if phase == "Restarting" else restarts)
    if phase == "Failed":
        assert f"maxRestarts ({max_restarts}) reached" in plan.status.message
        assert {c.type: c.status for c in plan.status.conditions}["Failed"] == "True"


def test_failed_is_terminal_and_keeps_pods_away() -> None:
    st = StatusWrapper().phase("Failed").restarts(3).get()
    plan = decide(observe(JobWrapper(), st, pods("demo", 1, generation=3)))
    assert (
        plan.status.phase == "Failed" and plan.create == [] and plan.delete == ["demo-0"] and not plan.events
    )


def test_suspend_deletes_pods_and_resume_recreates_them() -> None:
    running = StatusWrapper().phase("Running").get()
    plan = decide(observe(JobWrapper().replicas(2).suspend(), running, pods("demo", 2)))
    assert plan.status.phase == "Suspended" and plan.delete == ["demo-0", "demo-1"] and plan.create == []
    assert [e.reason for e in plan.events] == ["Suspended"]
    assert plan.status.suspensions == 1 and plan.restart_generation == 1
    again = decide(observe(JobWrapper().replicas(2).suspend(), plan.status, []))
    assert again.status.suspensions == 1 and again.events == []
    resumed = decide(observe(JobWrapper().replicas(2).suspend(False), again.status, []))
    assert resumed.status.phase == "Pending" and resumed.create == [0, 1] and resumed.status.restarts == 0
    assert resumed.restart_generation == 1  # a new gang: its driver resumes, ignoring the old gang's records


def test_progress_is_copied_into_status() -> None:
    progress = Progress(phase="train", iteration=7, weight_version=6, last_sync_seconds=1.5, reward_mean=0.25)
    plan = decide(observe(JobWrapper(), StatusWrapper().phase("Running").get(), pods("demo", 1), progress))
    st = plan.status
    assert (st.iteration, st.weight_version, st.last_sync_seconds, st.reward_mean) == (7, 6, 1.5, 0.25)
    assert st.phase == "Running"
    assert st.eval is None  # no evaluation reported yet


def test_eval_summary_is_copied_into_status_and_survives_a_round_trip() -> None:
    summary = EvalSummary(iteration=10, weight_version=11, pass_at_1=0.375, pass_at_k=0.625, k=4, prompts=16)
    progress = Progress(phase="train", iteration=12, weight_version=12, reward_mean=0.5, eval=summary)
    plan = decide(observe(JobWrapper(), StatusWrapper().phase("Running").get(), pods("demo", 1), progress))
    st = plan.status
    assert st.eval is not None
    assert (st.eval.iteration, st.eval.pass_at_1, st.eval.pass_at_k, st.eval.k) == (10, 0.375, 0.625, 4)
    assert st.iteration == 12  # the evaluation's iteration is its own, not the loop's
    # what the API server stores: camelCase under .status.eval (the CRD's Eval column reads passAt1)
    dumped = job_status.dump_status(st)
    assert dumped["eval"] == {"iteration": 10, "passAt1": 0.375, "passAtK": 0.625, "k": 4}
    assert job_status.read_status(dumped).eval == st.eval
    # the driver's record travels through etcd as camelCase JSON
    wire = Progress.model_validate_json(progress.model_dump_json(by_alias=True))
    assert wire.eval == summary
    # a later record without an evaluation keeps the last one; a newer evaluation replaces it
    keep = decide(observe(JobWrapper(), st, pods("demo", 1), Progress(phase="train", iteration=13)))
    assert keep.status.eval == st.eval and keep.status.iteration == 13
    newer = summary.model_copy(update={"iteration": 20, "pass_at_1": 0.5})
    plan = decide(observe(JobWrapper(), keep.status, pods("demo", 1),
                          Progress(phase="train", iteration=21, eval=newer)))
    assert plan.status.eval is not None and (plan.status.eval.iteration, plan.status.eval.pass_at_1) == (20, 0.5)


@pytest.mark.parametrize(
    ("progress", "pod_phase", "phase"),
    [
        (Progress(phase="done", iteration=200), "Running", "Succeeded"),
        (None, "Succeeded", "Succeeded"),
        (Progress(phase="failed", message="nan loss"), "Running", "Failed"),
    ],
)
def test_driver_or_pods_finish_the_job(progress: Progress | None, pod_phase: str, phase: str) -> None:
    plan = decide(
        observe(
            JobWrapper(), StatusWrapper().phase("Running").get(), pods("demo", 1, phase=pod_phase), progress
        )
    )
    assert plan.status.phase == phase
    if phase == "Failed":
        assert "nan loss" in plan.status.message and plan.delete == ["demo-0"]


def test_invalid_spec_names_the_field_and_creates_nothing() -> None:
    job = JobWrapper("x" * 60)
    plan = decide(observe(job, None, pods("x" * 60, 1)))
    assert plan.status.phase == "InvalidSpec" and "metadata.name" in plan.status.message
    assert plan.create == [] and plan.delete == ["x" * 60 + "-0"] and not plan.ensure_objects
    assert {c.type: c.status for c in plan.status.conditions}["SpecValid"] == "False"
    assert [(e.type, e.reason) for e in plan.events] == [("Warning", "InvalidSpec")]


def test_decide_is_idempotent_and_conditions_keep_their_transition_time() -> None:
    obs = observe(JobWrapper(), StatusWrapper().phase("Pending").get(), pods("demo", 1))
    first = decide(obs)
    assert first.status.phase == "Running"
    again = decide(Observation(**{**obs.__dict__, "status": first.status, "now": later(30)}))
    assert again.status == first.status and not again.events and again.create == [] and again.delete == []


def test_set_condition_moves_transition_time_only_on_flip() -> None:
    st = JobStatus()
    job_status.set_condition(st, "Ready", False, "Pending", "", T0)
    job_status.set_condition(st, "Ready", False, "Pending", "still", later(5))
    assert (
        st.conditions[0].last_transition_time == "2026-11-22T12:00:00Z"
        and st.conditions[0].message == "still"
    )
    job_status.set_condition(st, "Ready", True, "Running", "", later(9))
    assert st.conditions[0].last_transition_time == "2026-11-22T12:00:09Z"


@pytest.mark.parametrize(
    ("began", "backoff", "now", "left"),
    [(None, 10, T0, 0.0), (T0, 10, later(3), 7.0), (T0, 10, later(11), 0.0), (T0, 0, T0, 0.0)],
)
def test_backoff_remaining(began: datetime | None, backoff: int, now: datetime, left: float) -> None:
    assert restart_policy.backoff_remaining(began, backoff, now) == left


def test_pod_state_from_manifest() -> None:
    manifest = {
        "metadata": {
            "name": "demo-1",
            "deletionTimestamp": "x",
            "labels": {
                "tandem.dev/job": "demo",
                "tandem.dev/index": "1",
                "tandem.dev/role": "hybrid",
                "tandem.dev/restart-generation": "2",
            },
        },
        "status": {
            "phase": "Failed",
            "containerStatuses": [
                {"name": "trainer", "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}
            ],
        },
    }
    st = pod_state(manifest)
    assert st == PodState("demo-1", "demo", 1, "hybrid", 2, "Failed", True, "trainer exited 137: OOMKilled")
    assert pod_state({"metadata": {"name": "other", "labels": {}}}) is None


def test_plan_restart_generation_is_the_restart_count() -> None:
    assert Plan(status=StatusWrapper().restarts(4).get()).restart_generation == 4


def test_a_driver_waiting_for_a_healthy_rollout_shows_in_the_status() -> None:
    """Every rollout dead or restarting: the driver's wait (its progress message) becomes condition
    RolloutsAvailable False with the message and one Warning Event; once a rollout is back, True."""
    message = ("waiting for a healthy rollout (12s of 600s): no healthy rollout (pod demo-1 (10.0.0.5:8700): "
               "HTTP 503 engine_not_running)")
    waiting = Progress(phase="rollout", iteration=4, message=message)
    first = decide(observe(JobWrapper(), StatusWrapper().phase("Running").get(), pods("demo", 1), waiting))
    cond = next(c for c in first.status.conditions if c.type == "RolloutsAvailable")
    assert (cond.status, cond.reason, cond.message) == ("False", "NoHealthyRollout", message)
    posted = [(e.type, e.reason) for e in first.events if e.reason == "NoHealthyRollout"]
    assert posted == [("Warning", "NoHealthyRollout")]
    again = decide(observe(JobWrapper(), first.status, pods("demo", 1), waiting))
    assert not [e for e in again.events if e.reason == "NoHealthyRollout"]  # one Event per wait
    back = decide(observe(JobWrapper(), again.status, pods("demo", 1), Progress(phase="train", iteration=4)))
    assert next(c for c in back.status.conditions if c.type == "RolloutsAvailable").status == "True"
    calm = decide(observe(JobWrapper(), StatusWrapper().phase("Running").get(), pods("demo", 1),
                          Progress(phase="train", iteration=4)))
    assert not [c for c in calm.status.conditions if c.type == "RolloutsAvailable"]  # only once it has happened
