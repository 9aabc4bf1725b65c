"""A table of invalid RLHFJobs: each is rejected by the real API server (schema, enums, bounds, CEL
rules) or, where only the Python rules catch it, marked InvalidSpec by the operator — always with a
message naming the field. Each is also rejected offline by `tandem.spec.load.parse_job` naming the
same field (what `tandem validate` prints).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import pytest
from controlplane import ControlPlane
from harness import OperatorProcess, get_json, wait_for
from wrappers import JobWrapper

from tandem.spec.load import SpecError, parse_job

W = JobWrapper
Case = tuple[str, Callable[[], JobWrapper], str]

REJECTED: list[Case] = [
    ("replicas-zero", lambda: W().replicas(0), "spec.replicas"),
    ("replicas-string", lambda: W().replicas("two"), "spec.replicas"),  # type: ignore[arg-type]
    ("rollout-only-negative", lambda: W().rollout_only(-1), "spec.rolloutOnlyReplicas"),
    ("gpus-too-many", lambda: W().gpus(17), "spec.gpusPerPod"),
    ("model-missing", lambda: W().unset("model"), "spec.model"),
    ("model-path-empty", lambda: W().set("model.path", ""), "spec.model.path"),
    ("model-family-unknown", lambda: W().set("model.family", "gpt"), "spec.model.family"),
    ("algorithm-unknown", lambda: W().set("algorithm.name", "reinforce"), "spec.algorithm.name"),
    ("group-size-one", lambda: W().set("algorithm.groupSize", 1), "spec.algorithm.groupSize"),
    ("clip-above-one", lambda: W().set("algorithm.clip", 1.5), "spec.algorithm.clip"),  # 1: no lower bound (cispo)
    ("preset-of-ppo", lambda: W().set("algorithm.name", "ppo").set("algorithm.preset", "dapo"),
     "spec.algorithm.preset"),
    ("gae-for-grpo", lambda: W().set("algorithm.advantage", "gae"), "spec.algorithm.advantage"),
    ("rloo-for-ppo", lambda: W().set("algorithm.name", "ppo").set("algorithm.advantage", "rloo"),
     "spec.algorithm.advantage"),
    ("kl-in-loss-for-ppo", lambda: W().set("algorithm.name", "ppo").set("algorithm.klPenalty", "loss"),
     "spec.algorithm.klPenalty"),
    ("gspo-for-dpo", lambda: W().set("algorithm.name", "dpo").set("algorithm.policyLoss", "gspo"),
     "spec.algorithm.policyLoss"),
    ("overlong-for-ppo", lambda: W().set("algorithm.name", "ppo").set("algorithm.overlong", {"buffer": 4}),
     "spec.algorithm.overlong"),
    ("agg-norm-without-its-agg", lambda: W().set("algorithm.lossAggNorm", 512), "spec.algorithm.lossAggNorm"),
    ("dual-clip-at-one", lambda: W().set("algorithm.clipC", 1.0), "spec.algorithm.clipC"),
    ("dynamic-sampling-async", lambda: W().set("algorithm.dynamicSampling", {"maxRounds": 2})
     .set("algorithm.maxStaleness", 1).set("algorithm.tisCap", 2.0), "spec.algorithm.dynamicSampling"),
    ("dynamic-sampling-partial", lambda: W().set("algorithm.dynamicSampling", {}).set("rollout.maxTokens", 64)
     .set("rollout.partial", {"tokenBudget": 32}).set("algorithm.tisCap", 2.0), "spec.algorithm.dynamicSampling"),
    ("dynamic-sampling-ppo", lambda: W().set("algorithm.name", "ppo").set("algorithm.dynamicSampling", {}),
     "spec.algorithm.dynamicSampling"),
    ("lr-zero", lambda: W().set("algorithm.lr", 0), "spec.algorithm.lr"),
    ("kl-negative", lambda: W().set("algorithm.klCoef", -0.1), "spec.algorithm.klCoef"),
    ("iterations-zero", lambda: W().set("algorithm.iterations", 0), "spec.algorithm.iterations"),
    ("critic-without-ppo", lambda: W().set("algorithm.critic", True), "spec.algorithm.critic"),
    (
        "trainer-tp-not-dividing-gpus",
        lambda: W().set("trainer.tensorParallel", 3),
        "spec.trainer.tensorParallel",
    ),
    (
        "rollout-tp-not-dividing-gpus",
        lambda: W().set("rollout.tensorParallel", 3),
        "spec.rollout.tensorParallel",
    ),
    (
        "tp-pp-not-dividing-world",
        lambda: W().set("trainer.pipelineParallel", 3),
        "spec.trainer.pipelineParallel",
    ),
    (  # 8 GPUs, TP 1, PP 1: data parallelism 8
        "ep-not-dividing-dp",
        lambda: W().set("trainer.expertParallel", 3),
        "spec.trainer.expertParallel",
    ),
    (
        "ep-on-a-dense-family",
        lambda: W().set("model.family", "qwen2").set("trainer.expertParallel", 2),
        "spec.trainer.expertParallel",
    ),
    (
        "batch-not-multiple",
        lambda: W().set("trainer.globalBatchSize", 10).set("trainer.microBatchSize", 4),
        "spec.trainer.globalBatchSize",
    ),
    ("trainer-image-bad", lambda: W().set("trainer.image", "Bad Image"), "spec.trainer.image"),
    (
        "memory-not-a-quantity",
        lambda: W().set("trainer.resources", {"memory": "lots"}),
        "spec.trainer.resources.memory",
    ),
    ("temperature-too-high", lambda: W().set("rollout.temperature", 5), "spec.rollout.temperature"),
    ("top-p-zero", lambda: W().set("rollout.topP", 0), "spec.rollout.topP"),
    ("max-tokens-zero", lambda: W().set("rollout.maxTokens", 0), "spec.rollout.maxTokens"),
    (
        "between-rollouts-unknown",
        lambda: W().set("rollout.betweenRollouts", "pause"),
        "spec.rollout.betweenRollouts",
    ),
    ("rewards-empty", lambda: W().set("rewards", []), "spec.rewards"),
    ("rewards-missing", lambda: W().unset("rewards"), "spec.rewards"),
    ("reward-type-unknown", lambda: W().set("rewards", [{"type": "bleu"}]), "spec.rewards[0].type"),
    ("format-without-pattern", lambda: W().set("rewards", [{"type": "format"}]), "spec.rewards[0].pattern"),
    ("model-reward-without-path", lambda: W().set("rewards", [{"type": "model"}]), "spec.rewards[0].path"),
    # A format pattern is RE2 to the API server (CEL's matches, on the field) as to tandem validate and the reward.
    ("pattern-not-a-regex", lambda: W().set("rewards", [{"type": "format", "pattern": "(<answer>"}]),
     "spec.rewards[0].pattern"),
    ("pattern-backreference", lambda: W().set("rewards", [{"type": "format", "pattern": r"(a)\1"}]),
     "spec.rewards[0].pattern"),  # Python's re compiles it, RE2 does not
    ("pattern-lookahead", lambda: W().set("rewards", [{"type": "format", "pattern": "(?=x)"}]),
     "spec.rewards[0].pattern"),  # Python's re compiles it, RE2 does not
    ("pattern-of-the-second-reward", lambda: W().set("rewards", [{"type": "answerMatch"},
                                                                 {"type": "format", "pattern": "(<answer>"}]),
     "spec.rewards[1].pattern"),
    (
        "reward-weight-huge",
        lambda: W().set("rewards", [{"type": "answerMatch", "weight": 5000}]),
        "spec.rewards[0].weight",
    ),
    ("dataset-missing", lambda: W().unset("dataset"), "spec.dataset"),
    (
        "shm-size-bad-unit",
        lambda: W().set("checkpointEngine.shmSize", "64GB"),
        "spec.checkpointEngine.shmSize",
    ),
    (
        "transport-unknown",
        lambda: W().set("checkpointEngine.transport", "infiniband"),
        "spec.checkpointEngine.transport",
    ),
    ("ce-port-privileged", lambda: W().set("checkpointEngine.port", 80), "spec.checkpointEngine.port"),
    ("ce-port-rollout-past-65535", lambda: W().set("checkpointEngine.port", 65535), "spec.checkpointEngine.port"),
    ("ce-port-rollout-on-rendezvous", lambda: W().set("checkpointEngine.port", 29499), "spec.checkpointEngine.port"),
    ("shard-port-zero", lambda: W().set("checkpointEngine.shardPort", 0), "spec.checkpointEngine.shardPort"),
    ("shard-port-too-big", lambda: W().set("checkpointEngine.shardPort", 65536), "spec.checkpointEngine.shardPort"),
    ("shard-port-on-rollout-api", lambda: W().set("checkpointEngine.shardPort", 8701),
     "spec.checkpointEngine.shardPort"),
    ("shard-port-on-rendezvous", lambda: W().set("checkpointEngine.shardPort", 29500),
     "spec.checkpointEngine.shardPort"),
    ("etcd-tls-with-plain-endpoint", lambda: W().set("checkpointEngine.etcd",
                                                     {"endpoints": ["http://etcd:2379"], "tlsSecret": "etcd-tls"}),
     "spec.checkpointEngine.etcd.endpoints"),
    ("etcd-auth-secret-bad-name", lambda: W().set("checkpointEngine.etcd.authSecret", "Not_A_Name"),
     "spec.checkpointEngine.etcd.authSecret"),
    (
        "etcd-endpoint-without-scheme",
        lambda: W().etcd("etcd:2379"),
        "spec.checkpointEngine.etcd.endpoints[0]",
    ),
    (
        "max-restarts-negative",
        lambda: W().set("failurePolicy.maxRestarts", -1),
        "spec.failurePolicy.maxRestarts",
    ),
    (
        "volume-claim-and-host-path",
        lambda: W().volume("data", "/data", claimName="data", hostPath="/srv/data"),
        "spec.volumes[0].claimName",
    ),
    ("volume-without-source", lambda: W().volume("data", "/data"), "spec.volumes[0].claimName"),
    (
        "volume-names-duplicate",
        lambda: W().volume("data", "/data", claimName="a").volume("data", "/more", claimName="b"),
        "spec.volumes",
    ),
    (
        "volume-mount-paths-duplicate",
        lambda: W().volume("a", "/data", claimName="a").volume("b", "/data", hostPath="/srv"),
        "spec.volumes",
    ),
    ("volume-on-dev-shm", lambda: W().volume("a", "/dev/shm", claimName="a"), "spec.volumes[0].mountPath"),
    (
        "volume-under-job-file-dir",
        lambda: W().volume("a", "/etc/tandem/extra", hostPath="/srv"),
        "spec.volumes[0].mountPath",
    ),
    ("volume-mount-path-relative", lambda: W().volume("a", "data", claimName="a"), "spec.volumes[0].mountPath"),
    (
        "volume-host-path-dot-dot",
        lambda: W().volume("a", "/data", hostPath="/srv/../etc"),
        "spec.volumes[0].hostPath",
    ),
    ("volume-name-uppercase", lambda: W().volume("Data", "/data", claimName="a"), "spec.volumes[0].name"),
    ("volume-name-too-long", lambda: W().volume("v" * 60, "/data", claimName="a"), "spec.volumes[0].name"),
    ("volume-claim-name-bad", lambda: W().volume("a", "/data", claimName="My_Claim"), "spec.volumes[0].claimName"),
    (
        "volumes-too-many",
        lambda: _many_volumes(17),
        "spec.volumes",
    ),
    ("persist-without-volumes", lambda: W().persist("/ckpt"), "spec.checkpointEngine.persist.path"),
    (
        "persist-not-under-a-volume",
        lambda: W().volume("a", "/data", claimName="a").persist("/ckpt"),
        "spec.checkpointEngine.persist.path",
    ),
    (
        "persist-on-a-prefix-sibling",
        lambda: W().volume("a", "/data", claimName="a").persist("/data2/ckpt"),
        "spec.checkpointEngine.persist.path",
    ),
    (
        "persist-on-read-only-volume",
        lambda: W().volume("a", "/data", claimName="a", readOnly=True).persist("/data/ckpt"),
        "spec.checkpointEngine.persist.path",
    ),
    (
        "persist-path-relative",
        lambda: W().volume("a", "/data", claimName="a").persist("data/ckpt"),
        "spec.checkpointEngine.persist.path",
    ),
    (
        "persist-path-dot-dot",
        lambda: W().volume("a", "/data", claimName="a").persist("/data/../etc"),
        "spec.checkpointEngine.persist.path",
    ),
    (
        "persist-path-trailing-slash",
        lambda: W().volume("a", "/data", claimName="a").persist("/data/ckpt/"),
        "spec.checkpointEngine.persist.path",
    ),
    (
        "persist-keep-zero",
        lambda: W().volume("a", "/data", claimName="a").persist("/data/ckpt", keep=0),
        "spec.checkpointEngine.persist.keep",
    ),
    ("suspend-not-bool", lambda: W().suspend("maybe"), "spec.suspend"),  # type: ignore[arg-type]
    (  # spec.podTemplate: the schema's enums and the CEL rules of tandem.spec.podtemplate
        "pod-template-toleration-effect",
        lambda: W().set("podTemplate", {"spec": {"tolerations": [{"key": "k", "effect": "NeverSchedule"}]}}),
        "spec.podTemplate.spec.tolerations[0].effect",
    ),
    (
        "pod-template-contract-env",
        lambda: W().set("podTemplate", {"spec": {"containers": [{"name": "trainer", "env": [
            {"name": "TANDEM_TOKEN", "value": "mine"}]}]}}),
        "spec.podTemplate.spec.containers[0].env[0].name",
    ),
    (
        "pod-template-operator-label",
        lambda: W().set("podTemplate", {"metadata": {"labels": {"tandem.dev/role": "x"}}}),
        "spec.podTemplate.metadata.labels",
    ),
    (
        "pod-template-mount-of-nothing",
        lambda: W().set("podTemplate", {"spec": {"containers": [{"name": "rollout", "volumeMounts": [
            {"name": "nope", "mountPath": "/x"}]}]}}),
        "spec.podTemplate.spec.containers",
    ),
    (  # Pod Security: IPC_LOCK (RDMA) is the one capability a container may add
        "pod-template-capability-sys-admin",
        lambda: W().set("podTemplate", {"spec": {"containers": [{"name": "trainer", "securityContext": {
            "capabilities": {"add": ["IPC_LOCK", "SYS_ADMIN"]}}}]}}),
        "spec.podTemplate.spec.containers[0].securityContext.capabilities.add",
    ),
    (
        "pod-template-privileged",
        lambda: W().set("podTemplate", {"spec": {"containers": [{"name": "rollout", "securityContext": {
            "privileged": True}}]}}),
        "spec.podTemplate.spec.containers[0].securityContext.privileged",
    ),
    (
        "pod-template-privilege-escalation",
        lambda: W().set("podTemplate", {"spec": {"containers": [{"name": "trainer", "securityContext": {
            "allowPrivilegeEscalation": True}}]}}),
        "spec.podTemplate.spec.containers[0].securityContext.allowPrivilegeEscalation",
    ),
    (  # extended resources (an RDMA device) may be added; the GPUs, cpu and memory stay the operator's
        "pod-template-gpu-resource",
        lambda: W().set("podTemplate", {"spec": {"containers": [{"name": "trainer", "resources": {
            "limits": {"rdma/hca_shared_devices_a": 1, "nvidia.com/gpu": 1}}}]}}),
        "spec.podTemplate.spec.containers[0].resources.limits",
    ),
    (
        "pod-template-cpu-resource",
        lambda: W().set("podTemplate", {"spec": {"containers": [{"name": "rollout", "resources": {
            "limits": {"cpu": 4}}}]}}),
        "spec.podTemplate.spec.containers[0].resources.limits",
    ),
    ("failure-policy-action-unknown", lambda: W().set("failurePolicy.action", "Ignore"), "spec.failurePolicy.action"),
    ("failure-policy-container-restarts-zero", lambda: W().set("failurePolicy.maxContainerRestarts", 0),
     "spec.failurePolicy.maxContainerRestarts"),
    (  # rollouts that never wait: partial rollouts and bounded staleness
        "partial-budget-not-below-max-tokens",
        lambda: W().set("rollout.maxTokens", 64).set("rollout.partial", {"tokenBudget": 64})
        .set("algorithm.tisCap", 2.0),
        "spec.rollout.partial.tokenBudget",
    ),
    (
        "partial-and-max-staleness",
        lambda: W().set("rollout.partial", {"tokenBudget": 8}).set("algorithm.maxStaleness", 1)
        .set("algorithm.tisCap", 2.0),
        "spec.algorithm.maxStaleness",
    ),
    ("partial-without-tis-cap", lambda: W().set("rollout.partial", {"tokenBudget": 8}), "spec.algorithm.tisCap"),
    ("max-staleness-without-tis-cap", lambda: W().set("algorithm.maxStaleness", 2), "spec.algorithm.tisCap"),
    ("max-staleness-too-big", lambda: W().set("algorithm.maxStaleness", 65).set("algorithm.tisCap", 2.0),
     "spec.algorithm.maxStaleness"),
    ("tis-mode-unknown", lambda: W().set("algorithm.tisMode", "clip"), "spec.algorithm.tisMode"),
    ("unknown-field", lambda: W().set("learningRate", 0.1), "spec.learningRate"),
]


def _many_volumes(n: int) -> JobWrapper:
    w = W()
    for i in range(n):
        w.volume(f"v{i}", f"/mnt/v{i}", hostPath=f"/srv/v{i}")
    return w


# Accepted by the API server (its schema cannot express these); the operator marks them InvalidSpec.
OPERATOR_ONLY: list[Case] = [
    ("name-too-long", lambda: W("j" + "x" * 55), "metadata.name"),
    ("name-starts-with-digit", lambda: W("9lives"), "metadata.name"),
]


def offline_field(api_field: str) -> str:
    return re.sub(r"\[(\d+)\]", r".\1", api_field)


def test_the_table_is_big_enough() -> None:
    assert len(REJECTED) + len(OPERATOR_ONLY) >= 30


@pytest.mark.parametrize(
    ("case", "build", "field"), REJECTED + OPERATOR_ONLY, ids=[c[0] for c in REJECTED + OPERATOR_ONLY]
)
def test_offline_validation_names_the_field(case: str, build: Callable[[], JobWrapper], field: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_job(build().obj(), case)
    assert offline_field(field) in err.value.fields, str(err.value)


# Rollout modes the rules must let through (offline and by the API server's CEL rules).
VALID_MODES: list[tuple[str, Callable[[], JobWrapper]]] = [
    ("partial", lambda: W().set("rollout.partial", {"tokenBudget": 8}).set("algorithm.tisCap", 2.0)),
    ("partial-mask-age-0", lambda: W().set("rollout.partial", {"tokenBudget": 8, "maxAge": 0})
     .set("algorithm.tisCap", 1.0).set("algorithm.tisMode", "mask")),
    ("async", lambda: W().set("algorithm.maxStaleness", 2).set("algorithm.tisCap", 2.0)),
    ("dpo-async", lambda: W().set("algorithm.name", "dpo").set("algorithm.maxStaleness", 1)),  # no weights in dpo
    ("dpo-partial", lambda: W().set("algorithm.name", "dpo").set("rollout.partial", {"tokenBudget": 8})),
    ("sync", lambda: W().set("algorithm.maxStaleness", 0)),
]


@pytest.mark.parametrize(("case", "build"), VALID_MODES, ids=[c[0] for c in VALID_MODES])
def test_valid_rollout_mode_combinations_load(case: str, build: Callable[[], JobWrapper]) -> None:
    parse_job(build().obj(), case)


@pytest.mark.k8s
@pytest.mark.parametrize(("case", "build"), VALID_MODES, ids=[c[0] for c in VALID_MODES])
def test_api_server_accepts_valid_rollout_modes(installed: ControlPlane, case: str,
                                                build: Callable[[], JobWrapper]) -> None:
    doc = build().meta("name", case).obj()
    doc["metadata"]["namespace"] = "default"
    out = installed.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(doc), check=False)
    assert out.returncode == 0, out.stderr


@pytest.mark.k8s
@pytest.mark.parametrize(("case", "build", "field"), REJECTED, ids=[c[0] for c in REJECTED])
def test_api_server_rejects_naming_the_field(
    installed: ControlPlane, case: str, build: Callable[[], JobWrapper], field: str
) -> None:
    doc = build().meta("name", case).obj()
    doc["metadata"]["namespace"] = "default"
    out = installed.kubectl("create", "-f", "-", input=json.dumps(doc), check=False)
    assert out.returncode != 0, f"{case} was accepted"
    assert field in out.stderr, out.stderr


@pytest.mark.k8s
@pytest.mark.parametrize(("case", "build", "field"), OPERATOR_ONLY, ids=[c[0] for c in OPERATOR_ONLY])
def test_operator_marks_invalid_spec_naming_the_field(
    installed: ControlPlane,
    operator: OperatorProcess,
    ns: str,
    case: str,
    build: Callable[[], JobWrapper],
    field: str,
) -> None:
    doc = build().small().obj()
    doc["metadata"]["namespace"] = ns
    installed.kubectl("create", "-f", "-", input=json.dumps(doc))
    name = doc["metadata"]["name"]

    def invalid() -> dict[str, Any] | None:
        st = (get_json(installed, "rlhfjob", name, "-n", ns) or {}).get("status") or {}
        return st if st.get("phase") == "InvalidSpec" else None

    st = wait_for(f"{case} InvalidSpec", invalid, 30)
    assert offline_field(field) in st["message"], st["message"]
    assert {c["type"]: c["status"] for c in st["conditions"]}["SpecValid"] == "False"
    pods = (get_json(installed, "pods", "-n", ns, "-l", f"tandem.dev/job={name}") or {}).get("items", [])
    assert pods == []
