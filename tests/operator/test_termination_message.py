"""A sidecar that refuses to start shows why in the job's status: the builders ask the kubelet for the
termination message (FallbackToLogsOnError), `startup.refuse` writes the one line there, and the pod
summaries carry its last line into the failed pod's reason and the crash loop's issue, so status.message
and the stuck-gang verdict name the file and the spec field rather than "Error" or the kubelet's back-off."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from wrappers import JobWrapper

from tandem.operator.manifests import builders
from tandem.operator.policies import stuck_policy
from tandem.operator.policies.observe import ContainerIssue, pod_state
from tandem.sidecars.startup import refuse
from tandem.spec.models import FailurePolicy

WHY = "spec.model.path: /models/qwen/config.json is missing (a HuggingFace model directory has one)"
LOG_TAIL = f"2026-11-22 12:00:00 tandem.rollout INFO starting\n2026-11-22 12:00:01 tandem.rollout ERROR {WHY}\n"


def test_every_sidecar_container_asks_for_its_termination_message() -> None:
    pods = builders.build_pods(JobWrapper("demo").replicas(1).rollout_only(1).job())
    seen = []
    for pod in pods:
        for c in list(pod["spec"].get("initContainers", [])) + list(pod["spec"]["containers"]):
            seen.append(c["name"])
            assert c["terminationMessagePolicy"] == "FallbackToLogsOnError", c["name"]
    assert sorted(seen) == ["rollout", "rollout", "trainer"]


def raw_pod(status: dict[str, Any]) -> dict[str, Any]:
    labels = {"tandem.dev/job": "demo", "tandem.dev/index": "0", "tandem.dev/role": "hybrid",
              "tandem.dev/restart-generation": "0"}
    return {"metadata": {"name": "demo-0", "labels": labels}, "status": status}


def test_a_failed_trainer_names_its_reason() -> None:
    term = {"exitCode": 2, "reason": "Error", "message": WHY}
    st = pod_state(raw_pod({"phase": "Failed", "containerStatuses": [
        {"name": "trainer", "state": {"terminated": term}}]}))
    assert st is not None and st.reason == f"trainer exited 2: Error: {WHY}"


def test_a_crash_looping_rollout_names_its_reason_and_the_verdict_keeps_it() -> None:
    back_off = "back-off 40s restarting failed container=rollout pod=demo-0"
    status = {"phase": "Running", "initContainerStatuses": [{
        "name": "rollout", "restartCount": 3,
        "state": {"waiting": {"reason": "CrashLoopBackOff", "message": back_off}},
        "lastState": {"terminated": {"exitCode": 2, "reason": "Error", "message": LOG_TAIL}}}]}
    st = pod_state(raw_pod(status))
    assert st is not None
    assert st.issues == (ContainerIssue("rollout", "CrashLoopBackOff", f"exited 2: Error: 2026-11-22 12:00:01 "
                                        f"tandem.rollout ERROR {WHY}; {back_off}", 3),)
    assert WHY in stuck_policy.issues([st], 0)[0].describe()
    verdict = stuck_policy.verdict([st], 0, FailurePolicy(max_container_restarts=3), waiting_since=None,
                                   now=datetime.now(UTC))
    assert verdict is not None and verdict.reason == "ContainerRestartLimit" and WHY in verdict.message


def test_refuse_writes_the_termination_message_only_where_the_kubelet_made_the_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = logging.getLogger("tandem.test")
    path = tmp_path / "termination-log"
    assert refuse(log, WHY, termination_log=path) == 2 and not path.exists()  # not in a pod: nothing written
    path.touch()
    assert refuse(log, WHY + " " + "x" * 5000, 3, termination_log=path) == 3
    written = path.read_bytes()
    assert written.startswith(WHY.encode()) and len(written) == 4096  # the kubelet keeps at most 4096 bytes
    assert [r.getMessage()[:len(WHY)] for r in caplog.records] == [WHY, WHY]
