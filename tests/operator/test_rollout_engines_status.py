"""The rollouts' engine counts in the job's status: status.rolloutEngines (restarts, rejoins,
lastRecoverySeconds) copied from the driver's progress record, kept while a record carries none (a new driver
before its first iteration), kept by the CRD's status schema (a field it lacks would be dropped on write, and
`kubectl get rlhfjob -o yaml` would not show it), and the operator's gauges beside it.
Pure: the operator's decision on observed state, no cluster."""

from __future__ import annotations

from test_operator_plan import observe
from test_operator_pool_restart import prune, status_schema
from wrappers import JobWrapper, StatusWrapper, pods

from tandem.operator.policies import job_status
from tandem.operator.policies.plan import decide
from tandem.operator.runtime import job_metrics
from tandem.spec.progress import Progress, RolloutEngines
from tandem.spec.status import JobStatus

ENGINES = RolloutEngines(restarts=2, rejoins=3, last_recovery_seconds=46.6)


def pass_with(record: Progress, st: JobStatus | None = None) -> JobStatus:
    return decide(observe(JobWrapper(), st or StatusWrapper().phase("Running").get(), pods("demo", 1), record)).status


def test_the_drivers_counts_are_the_status_and_survive_the_crd_schema() -> None:
    got = pass_with(Progress(phase="train", iteration=5, rollout_engines=ENGINES))
    assert got.rollout_engines == ENGINES
    dumped = job_status.dump_status(got)
    assert dumped["rolloutEngines"] == {"restarts": 2, "rejoins": 3, "lastRecoverySeconds": 46.6}
    assert prune(dumped, status_schema())["rolloutEngines"] == dumped["rolloutEngines"]
    assert job_status.read_status(dumped).rollout_engines == ENGINES  # the next pass reads them back


def test_a_record_without_counts_keeps_the_last_ones() -> None:
    before = pass_with(Progress(phase="train", iteration=5, rollout_engines=ENGINES))
    assert pass_with(Progress(phase="rollout", iteration=0), before).rollout_engines == ENGINES
    moved = RolloutEngines(restarts=3, rejoins=3, last_recovery_seconds=9.0)
    assert pass_with(Progress(phase="train", iteration=6, rollout_engines=moved), before).rollout_engines == moved
    assert pass_with(Progress(phase="train", iteration=1)).rollout_engines is None  # none reported yet


def test_the_gauges_follow_the_status() -> None:
    def value(name: str) -> float | None:
        return job_metrics.REGISTRY.get_sample_value(name, {"namespace": "ns", "rlhfjob": "engines"})

    plan = decide(observe(JobWrapper(), StatusWrapper().phase("Running").get(), pods("demo", 1),
                          Progress(phase="train", iteration=1)))
    job_metrics.record("ns", "engines", plan)
    assert value("tandem_rlhfjob_rollout_engine_restarts") is None  # nothing measured: no sample, not a 0
    plan.status.rollout_engines = ENGINES
    job_metrics.record("ns", "engines", plan)
    assert (value("tandem_rlhfjob_rollout_engine_restarts"), value("tandem_rlhfjob_rollout_rejoins"),
            value("tandem_rlhfjob_rollout_recovery_seconds")) == (2.0, 3.0, 46.6)
    job_metrics.forget("ns", "engines")
    assert value("tandem_rlhfjob_rollout_rejoins") is None
