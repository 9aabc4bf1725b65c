"""The cases of the agreement test (test_agreement.py): RLHFJob specs that `tandem validate` and the API
server (the CRD's schema and CEL rules, a server-side dry run) must judge alike.

Three generators, each a list of (case id, changes): changes are {dotted spec path: value} applied to
`wrappers.JobWrapper`'s small valid job.
- RULE_CASES: for every `Rule` of the spec (CEL + Python), a spec that breaks it alone, and where the
  rule has a boundary, a spec just inside it. `rule_registry()` lists the rules; test_agreement checks
  that each is broken by some case, offline and in the API server, with its own message.
- type_cases(schema): from the CRD's schema, for every integer, number and boolean field reachable
  through objects: the value quoted ("8", "0.7", "false"), and for numbers an integer.
- preset_cases(): every preset alone and beside each setting a preset's fields meet in a rule.
"""

from __future__ import annotations

import json
from typing import Any

from tandem.spec import crd
from tandem.spec.presets import PRESETS

Changes = dict[str, Any]
Case = tuple[str, Changes]

KTO = {"algorithm.name": "kto", "dataset.completionField": "completion", "dataset.labelField": "label"}
TIS = {"algorithm.tisCap": 2.0}
TOOLS = {"rollout.environment": {"type": "tools", "tools": ["calculator"]}}


def _pt(spec: dict[str, Any] | None = None, metadata: dict[str, Any] | None = None) -> Changes:
    return {"podTemplate": {**({"spec": spec} if spec is not None else {}),
                            **({"metadata": metadata} if metadata is not None else {})}}


def _container(**fields: Any) -> Changes:
    return _pt({"containers": [{"name": "trainer", **fields}]})


def _affinity(kind: str, term: Any) -> Changes:
    return _pt({"affinity": {kind: term}})


RULE_CASES: list[Case] = [
    # spec.algorithm
    ("critic-on-grpo", {"algorithm.critic": True}),
    ("critic-on-ppo", {"algorithm.name": "ppo", "algorithm.critic": True}),
    ("tis-cap-on-dpo", {"algorithm.name": "dpo", "algorithm.tisCap": 2.0}),
    ("tis-cap-on-ppo", {"algorithm.name": "ppo", "algorithm.tisCap": 2.0}),
    ("preset-on-ppo", {"algorithm.name": "ppo", "algorithm.preset": "rloo"}),
    ("gae-on-grpo", {"algorithm.advantage": "gae"}),
    ("gae-on-dpo", {"algorithm.name": "dpo", "algorithm.advantage": "gae"}),
    ("grpo-advantage-on-dpo", {"algorithm.name": "dpo", "algorithm.advantage": "grpo"}),
    ("kl-in-loss-on-ppo", {"algorithm.name": "ppo", "algorithm.klPenalty": "loss"}),
    ("kl-in-reward-on-ppo", {"algorithm.name": "ppo", "algorithm.klPenalty": "reward"}),
    ("gspo-on-dpo", {"algorithm.name": "dpo", "algorithm.policyLoss": "gspo"}),
    ("clip-c-on-dpo", {"algorithm.name": "dpo", "algorithm.clipC": 3.0}),
    ("overlong-on-dpo", {"algorithm.name": "dpo", "algorithm.overlong": {}}),
    ("mask-truncated-on-dpo", {"algorithm.name": "dpo", "algorithm.maskTruncated": True}),
    ("mask-truncated-false-on-dpo", {"algorithm.name": "dpo", "algorithm.maskTruncated": False}),
    ("overlong-on-ppo", {"algorithm.name": "ppo", "algorithm.overlong": {"buffer": 4}}),
    ("mask-truncated-on-ppo", {"algorithm.name": "ppo", "algorithm.maskTruncated": True}),
    ("dynamic-sampling-on-ppo", {"algorithm.name": "ppo", "algorithm.dynamicSampling": {}}),
    ("distillation-on-ppo", {"algorithm.name": "ppo", "algorithm.distillation": {"teacher": "/models/t"}}),
    ("desirable-weight-on-grpo", {"algorithm.desirableWeight": 2.0}),
    ("undesirable-weight-on-grpo", {"algorithm.undesirableWeight": 2.0}),
    ("weights-on-kto", {**KTO, "algorithm.desirableWeight": 2.0, "algorithm.undesirableWeight": 0.5}),
    ("gspo-on-kto", {**KTO, "algorithm.policyLoss": "gspo"}),
    ("clip-c-on-kto", {**KTO, "algorithm.clipC": 3.0}),
    ("overlong-on-kto", {**KTO, "algorithm.overlong": {}}),
    ("mask-truncated-on-kto", {**KTO, "algorithm.maskTruncated": True}),
    ("tis-cap-on-kto", {**KTO, "algorithm.tisCap": 2.0}),
    ("max-staleness-on-kto", {**KTO, "algorithm.maxStaleness": 1}),
    # spec.algorithm.rolloutCorrection and mismatchGuard (tandem.spec.rollout_correction)
    ("correction-low-on-truncate", {"algorithm.rolloutCorrection": {"low": 0.5}}),
    ("correction-low-on-mask", {"algorithm.rolloutCorrection": {"mode": "mask", "low": 0.5, "high": 3.0}}),
    ("correction-icepop-on-sequences", {"algorithm.rolloutCorrection": {"mode": "icepop", "level": "sequence"}}),
    ("correction-icepop-defaults", {"algorithm.rolloutCorrection": {"mode": "icepop"}}),
    ("correction-aggregate-on-tokens", {"algorithm.rolloutCorrection": {"aggregate": "geometric"}}),
    ("correction-aggregate-on-sequences", {"algorithm.rolloutCorrection": {"level": "sequence",
                                                                           "aggregate": "geometric"}}),
    ("correction-low-at-one", {"algorithm.rolloutCorrection": {"mode": "mask", "low": 1.0}}),
    ("correction-high-below-one", {"algorithm.rolloutCorrection": {"high": 0.9}}),
    ("correction-beside-tis-cap", {"algorithm.rolloutCorrection": {}, **TIS}),
    ("correction-on-dpo", {"algorithm.name": "dpo", "algorithm.rolloutCorrection": {}}),
    ("correction-on-ppo", {"algorithm.name": "ppo", "algorithm.rolloutCorrection": {"level": "sequence"}}),
    ("correction-on-kto", {**KTO, "algorithm.rolloutCorrection": {}}),
    ("correction-for-stale-samples", {"algorithm.maxStaleness": 2, "algorithm.rolloutCorrection": {"mode": "icepop"}}),
    ("guard-on-dpo", {"algorithm.name": "dpo", "algorithm.mismatchGuard": {"threshold": 0.01}}),
    ("guard-on-kto", {**KTO, "algorithm.mismatchGuard": {"threshold": 0.01}}),
    ("guard-without-threshold", {"algorithm.mismatchGuard": {"action": "fail"}}),
    ("guard-threshold-zero", {"algorithm.mismatchGuard": {"threshold": 0}}),
    ("guard-pause", {"algorithm.mismatchGuard": {"metric": "mismatch", "threshold": 0.5, "iterations": 2,
                                                  "action": "pause"}}),
    ("guard-action-unknown", {"algorithm.mismatchGuard": {"threshold": 0.01, "action": "stop"}}),
    # spec.algorithm.routingReplay (MoE routing replay)
    ("routing-replay-on-dpo", {"algorithm.name": "dpo", "algorithm.routingReplay": "on"}),
    ("routing-replay-on-kto", {**KTO, "algorithm.routingReplay": "on"}),
    # spec.algorithm.oldLogprobs (the behaviour policy of every optimizer step)
    ("old-logprobs-rollout-on-dpo", {"algorithm.name": "dpo", "algorithm.oldLogprobs": "rollout"}),
    ("old-logprobs-rollout-on-kto", {**KTO, "algorithm.oldLogprobs": "rollout"}),
    ("old-logprobs-rollout-with-tis", {"algorithm.oldLogprobs": "rollout", "algorithm.tisCap": 2.0}),
    ("old-logprobs-rollout-with-guard", {"algorithm.oldLogprobs": "rollout",
                                         "algorithm.mismatchGuard": {"threshold": 0.01}}),
    ("old-logprobs-trainer", {"algorithm.oldLogprobs": "trainer", "algorithm.tisCap": 2.0}),
    ("old-logprobs-unknown", {"algorithm.oldLogprobs": "behaviour"}),
    ("routing-replay-off-on-dpo", {"algorithm.name": "dpo", "algorithm.routingReplay": "off"}),
    ("routing-replay-on-hf", {"trainer.engine": "hf", "algorithm.routingReplay": "on"}),
    ("routing-replay-auto-on-hf", {"trainer.engine": "hf", "algorithm.routingReplay": "auto"}),
    ("routing-replay-on-megatron", {"trainer.engine": "megatron", "algorithm.routingReplay": "on"}),
    ("routing-replay-on-tools", {**TOOLS, "algorithm.routingReplay": "on"}),
    ("routing-replay-unknown", {"algorithm.routingReplay": "always"}),
    # their numbers as kubectl may send them (type_cases does not reach into optional objects)
    ("correction-high-quoted", {"algorithm.rolloutCorrection": {"high": "3.0"}}),
    ("correction-high-integer", {"algorithm.rolloutCorrection": {"high": 3}}),
    ("correction-low-integer-zero", {"algorithm.rolloutCorrection": {"mode": "mask", "low": 0}}),
    ("guard-threshold-quoted", {"algorithm.mismatchGuard": {"threshold": "0.01"}}),
    ("guard-iterations-float", {"algorithm.mismatchGuard": {"threshold": 0.01, "iterations": 3.0}}),
    ("guard-iterations-quoted", {"algorithm.mismatchGuard": {"threshold": 0.01, "iterations": "3"}}),
    ("loss-agg-norm-without-its-agg", {"algorithm.lossAggNorm": 512}),
    ("loss-agg-norm-with-its-agg", {"algorithm.lossAggNorm": 512, "algorithm.lossAgg": "seq-mean-token-sum-norm"}),
    # spec.rollout.environment
    ("tools-without-tools", {"rollout.environment": {"type": "tools"}}),
    ("tools-on-single", {"rollout.environment": {"type": "single", "tools": ["calculator"]}}),
    ("custom-without-entry-point", {"rollout.environment": {"type": "custom"}}),
    ("entry-point-on-tools", {"rollout.environment": {"type": "tools", "tools": ["calculator"],
                                                      "entryPoint": "pkg.env:Env"}}),
    ("tools-calculator", TOOLS),
    # spec.trainer
    ("lora-rank-above-vllm", {"trainer.lora": {"rank": 1024}}),
    ("lora-rank-above-vllm-merged", {"trainer.lora": {"rank": 1024, "sync": "merged"}}),
    ("batch-not-multiple", {"trainer.globalBatchSize": 10, "trainer.microBatchSize": 4}),
    ("hf-engine-tensor-parallel", {"trainer.engine": "hf", "trainer.tensorParallel": 2}),
    ("lora-on-megatron", {"trainer.lora": {}, "trainer.engine": "megatron"}),
    ("lora-tensor-parallel", {"trainer.lora": {}, "trainer.tensorParallel": 2}),
    ("lora-on-auto", {"trainer.lora": {}}),
    # spec.rollout, rewards, dataset, checkpointEngine, volumes, tracking
    ("spare-engine-terminate", {"gpusPerPod": 0, "rollout.spareEngine": True}),
    ("spare-engine-sleep", {"gpusPerPod": 0, "rollout.spareEngine": True, "rollout.betweenRollouts": "sleep"}),
    ("spare-engine-keep-cpu", {"gpusPerPod": 0, "rollout.spareEngine": True, "rollout.betweenRollouts": "keep"}),
    ("spare-engine-on-gpus", {"rollout.spareEngine": True, "rollout.betweenRollouts": "keep"}),
    ("partial-budget-at-max-tokens", {"rollout.maxTokens": 64, "rollout.partial": {"tokenBudget": 64}, **TIS}),
    ("partial-budget-below-max-tokens", {"rollout.maxTokens": 64, "rollout.partial": {"tokenBudget": 63}, **TIS}),
    ("format-without-pattern", {"rewards": [{"type": "format"}]}),
    ("model-reward-without-path", {"rewards": [{"type": "model"}]}),
    ("flexible-match-on-format", {"rewards": [{"type": "format", "pattern": "x", "match": "flexible"}]}),
    ("system-prompt-without-template", {"dataset.chatTemplate": False, "dataset.systemPrompt": "be brief"}),
    ("images-without-template", {"dataset.chatTemplate": False, "dataset.images": {"maxPerPrompt": 1}}),
    ("images-with-template", {"dataset.images": {"field": "picture", "maxPixels": 4096, "resize": "downscale"}}),
    ("images-below-min-pixels", {"dataset.images": {"maxPixels": 10}}),
    ("freeze-tower-and-projector", {"trainer.freeze": ["visionTower", "projector"]}),
    ("freeze-unknown-part", {"trainer.freeze": ["languageModel"]}),
    ("etcd-tls-plain-endpoint", {"checkpointEngine.etcd": {"endpoints": ["http://etcd:2379"], "tlsSecret": "tls"}}),
    ("shard-port-on-rollout-api", {"checkpointEngine.shardPort": 8701}),
    ("port-on-rendezvous", {"checkpointEngine.port": 29499}),
    ("volume-without-source", {"volumes": [{"name": "a", "mountPath": "/data"}]}),
    ("volume-on-dev-shm", {"volumes": [{"name": "a", "mountPath": "/dev/shm/x", "claimName": "a"}]}),
    ("mlflow-credentials-in-uri", {"tracking.mlflow": {"trackingUri": "http://me:secret@mlflow:5000"}}),
    ("wandb-credentials-in-url", {"tracking.wandb": {"baseUrl": "https://me:secret@wandb.example.com"}}),
    ("wandb-url-plain", {"tracking.wandb": {"baseUrl": "https://wandb.example.com", "project": "rl"}}),
    # spec (JobSpec)
    ("trainer-tp-not-dividing-gpus", {"trainer.tensorParallel": 3}),
    ("rollout-tp-not-dividing-gpus", {"rollout.tensorParallel": 3}),
    ("tp-pp-not-dividing-world", {"trainer.pipelineParallel": 3}),
    ("volume-names-duplicate", {"volumes": [{"name": "a", "mountPath": "/a", "claimName": "a"},
                                            {"name": "a", "mountPath": "/b", "claimName": "b"}]}),
    ("volume-paths-duplicate", {"volumes": [{"name": "a", "mountPath": "/a", "claimName": "a"},
                                            {"name": "b", "mountPath": "/a", "claimName": "b"}]}),
    ("eval-without-judge", {"eval": {"dataset": {"path": "/data/e.jsonl"}},
                            "rewards": [{"type": "format", "pattern": "x"}]}),
    ("persist-without-volume", {"checkpointEngine.persist": {"path": "/ckpt"}}),
    ("export-without-volume", {"export": {"path": "/out"}}),
    ("partial-and-async", {"rollout.partial": {"tokenBudget": 8}, "algorithm.maxStaleness": 1, **TIS}),
    ("dynamic-sampling-partial", {"algorithm.dynamicSampling": {}, "rollout.partial": {"tokenBudget": 8}, **TIS}),
    ("dynamic-sampling-reward-model", {"algorithm.dynamicSampling": {},
                                       "rewards": [{"type": "model", "path": "/models/rm"}]}),
    ("kto-without-completion-field", {"algorithm.name": "kto", "dataset.labelField": "label"}),
    ("kto-without-label-field", {"algorithm.name": "kto", "dataset.completionField": "completion"}),
    ("completion-field-on-grpo", {"dataset.completionField": "completion"}),
    ("label-field-on-grpo", {"dataset.labelField": "label"}),
    ("eval-dataset-label-field", {"eval": {"dataset": {"path": "/data/e.jsonl", "labelField": "label"}}}),
    ("kto-partial", {**KTO, "rollout.partial": {"tokenBudget": 8}}),
    ("async-without-tis-cap", {"algorithm.maxStaleness": 2}),
    ("critic-on-hf", {"algorithm.name": "ppo", "algorithm.critic": True, "trainer.engine": "hf"}),
    ("critic-with-lora", {"algorithm.name": "ppo", "algorithm.critic": True, "trainer.lora": {}}),
    ("lora-sleep-level-2", {"trainer.lora": {}, "rollout.sleepLevel": 2}),
    ("lora-sleep-level-1", {"trainer.lora": {}, "rollout.sleepLevel": 1}),
    ("environment-reward-without-environment", {"rewards": [{"type": "environment"}]}),
    ("multi-turn-dpo", {"algorithm.name": "dpo", **TOOLS}),
    ("multi-turn-dynamic-sampling", {"algorithm.dynamicSampling": {}, **TOOLS}),
    ("pod-template-mount-of-nothing", _pt({"containers": [{"name": "rollout", "volumeMounts": [
        {"name": "nope", "mountPath": "/x"}]}]})),
    ("pod-template-mount-on-volume-path", {"volumes": [{"name": "a", "mountPath": "/a", "claimName": "a"}],
                                           **_pt({"containers": [{"name": "rollout", "volumeMounts": [
                                               {"name": "a", "mountPath": "/a"}]}]})}),
    ("pod-template-volume-name-clash", {"volumes": [{"name": "a", "mountPath": "/a", "claimName": "a"}],
                                       **_pt({"volumes": [{"name": "a", "emptyDir": {}}]})}),
    ("ep-not-dividing-dp", {"trainer.expertParallel": 3}),
    ("ep-on-a-dense-family", {"model.family": "qwen2", "trainer.expertParallel": 2}),
    ("ep-on-mixtral", {"model.family": "mixtral", "trainer.expertParallel": 2}),
    # spec.podTemplate
    ("label-key-bad", _pt(metadata={"labels": {"a b": "x"}})),
    ("label-key-operators", _pt(metadata={"labels": {"tandem.dev/role": "x"}})),
    ("label-key-kueue", _pt(metadata={"labels": {"kueue.x-k8s.io/queue-name": "q"}})),
    ("annotation-key-bad", _pt(metadata={"annotations": {"a b": "x"}})),
    ("annotation-key-operators", _pt(metadata={"annotations": {"tandem.dev/x": "x"}})),
    ("annotation-key-kueue", _pt(metadata={"annotations": {"kueue.x-k8s.io/x": "x"}})),
    ("toleration-without-key", _pt({"tolerations": [{"operator": "Equal", "value": "v"}]})),
    ("toleration-exists-with-value", _pt({"tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]})),
    ("toleration-seconds-no-schedule", _pt({"tolerations": [{"key": "k", "effect": "NoSchedule",
                                                             "tolerationSeconds": 5}]})),
    ("node-selector-in-without-values", _affinity("nodeAffinity", {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "k", "operator": "In"}]}]}})),
    ("label-selector-in-without-values", _affinity("podAffinity", {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": "t", "labelSelector": {"matchExpressions": [{"key": "k", "operator": "In"}]}}]})),
    ("env-value-from-empty", _container(env=[{"name": "X", "valueFrom": {}}])),
    ("env-contract-name", _container(env=[{"name": "TANDEM_TOKEN", "value": "x"}])),
    ("env-value-and-value-from", _container(env=[{"name": "X", "value": "v", "valueFrom": {
        "secretKeyRef": {"name": "s", "key": "k"}}}])),
    ("env-from-empty", _container(envFrom=[{}])),
    ("mount-on-dev-shm", {**_pt({"volumes": [{"name": "v", "emptyDir": {}}], "containers": [
        {"name": "trainer", "volumeMounts": [{"name": "v", "mountPath": "/dev/shm"}]}]})}),
    ("capability-sys-admin", _container(securityContext={"capabilities": {"add": ["SYS_ADMIN"]}})),
    ("capability-ipc-lock", _container(securityContext={"capabilities": {"add": ["IPC_LOCK"]}})),
    ("privileged", _container(securityContext={"privileged": True})),
    ("privilege-escalation", _container(securityContext={"allowPrivilegeEscalation": True})),
    ("run-as-user", _container(securityContext={"runAsUser": 0})),
    ("run-as-group", _container(securityContext={"runAsGroup": 0})),
    ("run-as-root", _container(securityContext={"runAsNonRoot": False})),
    ("limits-cpu", _container(resources={"limits": {"cpu": 4}})),
    ("limits-milli", _container(resources={"limits": {"rdma/hca_shared_devices_a": "500m"}})),
    ("limits-zero", _container(resources={"limits": {"rdma/hca_shared_devices_a": 0}})),
    ("limits-quoted-whole", _container(resources={"limits": {"rdma/hca_shared_devices_a": "1"}})),
    ("limits-integer", _container(resources={"limits": {"rdma/hca_shared_devices_a": 2}})),
    ("limits-kilo", _container(resources={"limits": {"example.com/dev": "2k"}})),
    ("pod-volume-without-source", _pt({"volumes": [{"name": "v"}]})),
    ("pod-volume-named-shm", _pt({"volumes": [{"name": "shm", "emptyDir": {}}]})),
    ("pod-volumes-duplicate", _pt({"volumes": [{"name": "v", "emptyDir": {}}, {"name": "v", "emptyDir": {}}]})),
    ("containers-duplicate", _pt({"containers": [{"name": "trainer"}, {"name": "trainer"}]})),
    ("host-network", _pt({"hostNetwork": True})),
    ("host-network-false", _pt({"hostNetwork": False})),
    ("host-pid", _pt({"hostPID": True})),
    ("host-ipc", _pt({"hostIPC": True})),
    ("automount-token", _pt({"automountServiceAccountToken": True})),
    ("pod-security-context", _pt({"securityContext": {"runAsUser": 0}})),
    # quantities as Kubernetes takes them
    ("cpu-integer", {"trainer.resources": {"cpu": 8, "memory": "64Gi"}}),
    ("cpu-milli", {"rollout.resources": {"cpu": "500m", "memory": "1Gi"}}),
    ("cpu-negative", {"trainer.resources": {"cpu": -1}}),
    ("shm-size-integer", {"checkpointEngine.shmSize": 1073741824}),
    ("shm-size-bad-unit", {"checkpointEngine.shmSize": "64GB"}),
    ("cpu-fraction-number", {"trainer.resources": {"cpu": 0.5}}),
]


def rule_registry() -> list[tuple[str, str, str]]:
    """Every Rule the CRD carries, as (model class, field path, message)."""
    out = []
    for title, rules in crd._rules_by_title().items():
        for rule in rules:
            field, _, message = rule["message"].partition(": ")
            out.append((title, rule["fieldPath"], message))
    return out


def _scalars(node: dict[str, Any], path: str) -> list[tuple[str, dict[str, Any]]]:
    """(dotted path, schema) of every integer, number and boolean field reachable through objects."""
    out: list[tuple[str, dict[str, Any]]] = []
    for name, prop in node.get("properties", {}).items():
        here = f"{path}.{name}" if path else name
        if prop.get("type") in ("integer", "number", "boolean"):
            out.append((here, prop))
        elif prop.get("type") == "object" and not prop.get("nullable") and "properties" in prop:
            out += _scalars(prop, here)
    return out


def _valid(prop: dict[str, Any]) -> Any:
    if "default" in prop:
        return prop["default"]
    if prop["type"] == "boolean":
        return False
    return prop.get("minimum", 1) + (1 if prop.get("exclusiveMinimum") else 0)


def type_cases() -> list[Case]:
    """Quoted integers, numbers and booleans ("8", "0.7", "false"), and integers for numbers."""
    out: list[Case] = []
    for path, prop in _scalars(crd.spec_schema(), ""):
        value = _valid(prop)
        out.append((f"quoted-{path}", {path: json.dumps(value) if prop["type"] != "number" else str(value)}))
        if prop["type"] == "number" and float(value).is_integer():
            out.append((f"integer-{path}", {path: int(value)}))
        if prop["type"] == "integer":
            out.append((f"float-{path}", {path: float(value)}))  # 8.0 is the integer 8 to the API server
    return out


# What a preset's fields meet in rules: each beside each preset (the preset's values or the job's decide).
BESIDE_PRESET: dict[str, Changes] = {
    "alone": {},
    "loss-agg-norm": {"algorithm.lossAggNorm": 512},
    "async": {"algorithm.maxStaleness": 1, **TIS},
    "partial": {"rollout.partial": {"tokenBudget": 8}, **TIS},
    "reward-model": {"rewards": [{"type": "model", "path": "/models/rm"}]},
    "tools": TOOLS,
    "on-ppo": {"algorithm.name": "ppo"},
    "own-dynamic-sampling": {"algorithm.dynamicSampling": {"maxRounds": 2}, "algorithm.maxStaleness": 1, **TIS},
    "own-loss-agg": {"algorithm.lossAgg": "seq-mean-token-sum-norm", "algorithm.lossAggNorm": 512},
}


def preset_cases() -> list[Case]:
    return [(f"preset-{preset}-{what}", {"algorithm.preset": preset, **changes})
            for preset in sorted(PRESETS) for what, changes in BESIDE_PRESET.items()]
