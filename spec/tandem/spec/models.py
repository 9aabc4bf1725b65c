"""Pydantic models of the RLHFJob custom resource (spec and status).

Role: the single source of the job's shape. Field names are camelCase on the wire (aliases) and
snake_case in Python. Cross-field rules are declared once per model as `Rule`s: each carries a CEL
expression (emitted into the CRD as `x-kubernetes-validations`, enforced by the API server) and the
equivalent Python predicate (enforced by `tandem validate`, `tandem run` and the operator).
Here: the RLHFJob root (`JobSpec`, `RLHFJob`), the fields that tie the parts together and their
cross-part rules, and the smaller parts (reference, volumes, export, failure policy). The larger parts have
files of their own: `trainer` (model, trainer), `algorithm`, `rollout`, `environment`, `rewards`, `data`
(dataset, eval), `ckpt_engine` (checkpointEngine), `podtemplate`, `rollout_correction`, `tracking`, and the
status the operator writes, `status`.
Callers: everything that reads a job; `tandem.spec.crd` turns these models into the CRD schema.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tandem.spec import presets
from tandem.spec.algorithm import Algorithm as Algorithm  # re-exported: JobSpec.algorithm's type
from tandem.spec.ckpt_engine import CheckpointEngine
from tandem.spec.data import Dataset, Eval
from tandem.spec.parallel import PARALLEL_RULES
from tandem.spec.podtemplate import JOB_RULES, PodTemplate
from tandem.spec.rewards import Reward
from tandem.spec.rollout import SPARE_RULES, Rollout
from tandem.spec.rollout_correction import MismatchGuard as MismatchGuard  # re-exported: crd.py finds its rules
from tandem.spec.rollout_correction import RolloutCorrection as RolloutCorrection
from tandem.spec.status import JobStatus
from tandem.spec.strict_model import ABS_PATH, DNS_LABEL, DNS_SUBDOMAIN, Base, Rule
from tandem.spec.tracking import MLflow as MLflow  # re-exported: crd.py finds its rules
from tandem.spec.tracking import Tracking as Tracking
from tandem.spec.tracking import WandB as WandB
from tandem.spec.trainer import Lora as Lora  # re-exported, with the rest of spec.trainer's shape
from tandem.spec.trainer import ModelRef as ModelRef
from tandem.spec.trainer import Resources as Resources
from tandem.spec.trainer import Trainer as Trainer
from tandem.spec.trainer import model_type as model_type
from tandem.spec.trainer import vision_language

GROUP = "tandem.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "RLHFJob"
PLURAL = "rlhfjobs"


VISION_FAMILIES = ("llava", "qwen2_5_vl")  # vision-language layouts the trainer prepares: LLaVA's pixel values
# [pictures, 3, H, W]; Qwen2.5-VL's grids of patches with 3-D positions (sidecars' trainer/engines/vision_inputs.py)

class Reference(Base):
    path: Annotated[str | None, Field(min_length=1, description="Reference model; default: the initial model.")] = None


class Volume(Base):
    """A PersistentVolumeClaim or a hostPath directory, mounted at mountPath in every container of the job."""

    name: Annotated[str, Field(pattern=DNS_LABEL, max_length=59,
                               description="Pods name the volume vol-<name> (a DNS label of at most 63).")]
    mount_path: Annotated[str, Field(pattern=ABS_PATH, max_length=256)]
    claim_name: Annotated[str | None, Field(pattern=DNS_SUBDOMAIN, max_length=253,
                                            description="PersistentVolumeClaim in the job's namespace.")] = None
    host_path: Annotated[str | None, Field(pattern=ABS_PATH, max_length=256,
                                           description="Directory on the node (tandem run: on this machine).")] = None
    read_only: bool = False
    rules = (
        Rule("has(self.claimName) != has(self.hostPath)", "exactly one of claimName and hostPath must be set",
             ".claimName", lambda v: (v.claim_name is None) != (v.host_path is None)),
        Rule("!['/dev/shm', '/etc/tandem'].exists(p, self.mountPath == p || self.mountPath.startsWith(p + '/'))",
             "must not be /dev/shm or /etc/tandem (the pod's own mounts)", ".mountPath",
             lambda v: not any(under(v.mount_path, p) for p in ("/dev/shm", "/etc/tandem"))),
    )


def under(path: str, directory: str) -> bool:
    """`path` is `directory` or lies below it (both normalised absolute paths)."""
    return path == directory or path.startswith(directory + "/")


def _unique(values: list[str]) -> bool:
    return len(values) == len(set(values))


def _persist_on_volume(s: JobSpec) -> bool:
    p = s.checkpoint_engine.persist
    return p is None or any(not v.read_only and under(p.path, v.mount_path) for v in s.volumes)


class Export(Base):
    """HuggingFace model directories of the trained policy (tandem.checkpoint_engine.versions.hf_export)."""

    path: Annotated[str, Field(pattern=ABS_PATH, max_length=1024, description="Directory on a writable volume "
                               "(volumes[].mountPath); <path>/iteration-<N> is written every `every` iterations "
                               "and after the last, each loadable by transformers' from_pretrained and vllm serve.")]
    every: Annotated[int, Field(ge=1, le=1_000_000, description="Iterations between exports; the last iteration "
                                "is always exported.")] = 50
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto", description="dtype of the written weights; auto keeps the published version's.")


def _export_on_volume(s: JobSpec) -> bool:
    e = s.export
    return e is None or any(not v.read_only and under(e.path, v.mount_path) for v in s.volumes)


class FailurePolicy(Base):
    """Gang restarts, and when a stuck gang fails: its pods (and their GPUs) go, then it restarts or fails."""

    max_restarts: Annotated[int, Field(ge=0, le=1000, description="Gang restarts before the job fails. Also "
                                       "bounds replacing lost rollout-only pods alone: more than max(1, "
                                       "maxRestarts) x rolloutOnlyReplicas replacements within an hour count as a "
                                       "stuck pool (reason RolloutReplacementLimit), which restarts the gang or "
                                       "fails the job as `action` says.")] = 3
    backoff_seconds: Annotated[int, Field(ge=0, le=3600)] = 10
    max_container_restarts: Annotated[int, Field(ge=1, le=1000, description="A container of the gang restarted "
                                      "this many times (restartCount, e.g. in CrashLoopBackOff) fails the "
                                      "gang.")] = 5
    waiting_timeout_seconds: Annotated[int, Field(ge=0, le=86_400, description="Seconds a container may wait in "
                                       "ImagePullBackOff, ErrImagePull, InvalidImageName or "
                                       "CreateContainerConfigError before the gang fails; 0: forever.")] = 300
    scheduling_timeout_seconds: Annotated[int, Field(ge=0, le=86_400, description="Seconds the gang may stay "
                                          "not fully scheduled (a pod Pending, Unschedulable; the others hold "
                                          "their GPUs meanwhile) before it fails; 0: forever.")] = 600
    action: Literal["RestartJob", "FailJob"] = Field(default="RestartJob", description="What a gang that failed "
                                                     "one of the three limits above does: RestartJob (a gang "
                                                     "restart, counted against maxRestarts) or FailJob.")
    rollout_stall_seconds: Annotated[int, Field(ge=5, le=86_400, description="The ceiling on how long a "
                                     "rollout's call into vLLM (a step of generation, a weight reload) may go "
                                     "without progress before the rollout counts as hung: the driver drops it from "
                                     "the iteration and sends its unfinished prompts to the healthy rollouts, and "
                                     "its sidecar kills and restarts the engine. Below it the deadline follows the "
                                     "job's pace: 20x the p99 duration of the recent calls of that kind, at least "
                                     "5 s; this ceiling holds for an engine's first calls of a kind after each "
                                     "start and until enough were seen (16 steps, 3 reloads), and is also how long "
                                     "the driver waits for a sidecar whose /health does not answer.")] = 120
    rollout_unavailable_seconds: Annotated[int, Field(ge=0, le=86_400, description="Seconds the driver waits, "
                                           "with the reason in the job's status, while no rollout is healthy "
                                           "(engines restarting, rollout-only pods being replaced) before the "
                                           "job fails.")] = 600


KTO_ONLY = ("applies to kto only (a labelled dataset); the other algorithms generate their completions and score "
            "them with spec.rewards")


def _multi_turn_ok(s: JobSpec) -> bool:
    env = s.rollout.environment
    return env is None or env.type == "single" or (s.rollout.partial is None and s.algorithm.name not in ("dpo", "kto"))


# algorithm.dynamicSampling as the job or its preset (dapo) sets it; a refusal names the preset
_DYNAMIC = presets.cel_set("dynamicSampling", "self.algorithm")
_DYNAMIC_PRESET = {"preset_field": "dynamicSampling", "algorithm": "self.algorithm"}


class JobSpec(Base):
    model: ModelRef
    algorithm: Algorithm = Field(default_factory=Algorithm)
    replicas: Annotated[int, Field(ge=1, le=4096)] = 1
    rollout_only_replicas: Annotated[int, Field(ge=0, le=4096)] = 0
    gpus_per_pod: Annotated[int, Field(ge=0, le=16, description="0 runs on CPU.")] = 8
    gpu_allocation: Literal["devicePlugin", "dra"] = Field(default="devicePlugin", description=(
        "How the pod's trainer and rollout share its GPUs. devicePlugin: the trainer requests nvidia.com/gpu and "
        "the rollout (NVIDIA_VISIBLE_DEVICES=all) uses exactly the trainer's devices; needs a container toolkit "
        "that honours that variable in unprivileged containers. dra: one ResourceClaim per pod (from a "
        "ResourceClaimTemplate of gpuDeviceClassName) referenced by both containers; needs a DRA GPU driver."))
    gpu_device_class_name: Annotated[str, Field(pattern=DNS_SUBDOMAIN, max_length=253, description=(
        "DeviceClass of the GPUs with gpuAllocation: dra (NVIDIA's DRA driver: gpu.nvidia.com)."))] = "gpu.nvidia.com"
    trainer: Trainer = Field(default_factory=Trainer)
    rollout: Rollout = Field(default_factory=Rollout)
    rewards: Annotated[list[Reward], Field(min_length=1, max_length=32)]
    reference: Reference = Field(default_factory=Reference)
    dataset: Dataset
    eval: Eval | None = Field(default=None, description="Held-out evaluation (pass@1, pass@k) during the run.")
    checkpoint_engine: CheckpointEngine = Field(default_factory=CheckpointEngine)
    export: Export | None = Field(default=None, description="HuggingFace model directories of the policy "
                                  "written during the run.")
    tracking: Tracking = Field(default_factory=Tracking)
    volumes: Annotated[list[Volume], Field(max_length=16, description="Volumes mounted in every container "
                                           "(models, datasets, durable checkpoints).")] = Field(default_factory=list)
    failure_policy: FailurePolicy = Field(default_factory=FailurePolicy)
    seed: Annotated[int, Field(ge=0, le=2**31 - 1, description="Seeds the run: the prompt order, the trainer's "
                               "initialisation and every sampler (each pod's vLLM engine, each request). Repeats of "
                               "one job that should differ take different seeds.")] = 0
    suspend: bool = False
    gang_scheduling: bool = Field(default=False, description="Schedule the hybrid pods all-or-nothing with "
                                  "Kubernetes' own gang scheduling: the operator creates a Workload and one "
                                  "PodGroup per gang (scheduling.k8s.io/v1alpha2; Kubernetes >= 1.36 with the "
                                  "GenericWorkload and GangScheduling feature gates). Rollout-only pods stay "
                                  "outside the gang.")
    pod_template: PodTemplate | None = Field(default=None, description="Merged over every pod the operator "
                                             "makes: labels, annotations, scheduling (nodeSelector, tolerations, "
                                             "affinity, priorityClassName), imagePullSecrets, serviceAccountName, "
                                             "volumes, and env/envFrom/volumeMounts per container; rolloutOnly "
                                             "schedules the rollout-only pods apart (e.g. on spot nodes).")
    pod_disruption_budget: bool = Field(default=True, description="A PodDisruptionBudget `<job>-hybrid` (owned by "
                                        "the job) with minAvailable = replicas over the hybrid pods: a node drain or "
                                        "scale-down waits instead of evicting a trainer, which would restart the "
                                        "gang; pods not Ready may still be evicted (unhealthyPodEvictionPolicy "
                                        "AlwaysAllow). Set false to let drains take them (the operator deletes the "
                                        "budget). Rollout-only pods are never covered: one evicted is replaced alone.")
    rules = (
        Rule("self.gpusPerPod == 0 || self.gpusPerPod % self.trainer.tensorParallel == 0",
             "trainer.tensorParallel must divide gpusPerPod", ".trainer.tensorParallel",
             lambda s: s.gpus_per_pod == 0 or s.gpus_per_pod % s.trainer.tensor_parallel == 0),
        Rule("self.gpusPerPod == 0 || self.gpusPerPod % self.rollout.tensorParallel == 0",
             "rollout.tensorParallel must divide gpusPerPod", ".rollout.tensorParallel",
             lambda s: s.gpus_per_pod == 0 or s.gpus_per_pod % s.rollout.tensor_parallel == 0),
        Rule("self.gpusPerPod == 0 || (self.replicas * self.gpusPerPod) % "
             "(self.trainer.tensorParallel * self.trainer.pipelineParallel) == 0",
             "trainer.tensorParallel * trainer.pipelineParallel must divide replicas * gpusPerPod",
             ".trainer.pipelineParallel",
             lambda s: s.gpus_per_pod == 0 or (s.replicas * s.gpus_per_pod)
             % (s.trainer.tensor_parallel * s.trainer.pipeline_parallel) == 0),
        Rule("self.algorithm.name != 'dpo' || self.algorithm.groupSize >= 2",
             "dpo needs groupSize >= 2 to form pairs", ".algorithm.groupSize",
             lambda s: s.algorithm.name != "dpo" or s.algorithm.group_size >= 2),
        Rule("!has(self.volumes) || self.volumes.all(v, self.volumes.exists_one(w, w.name == v.name))",
             "names must be unique", ".volumes", lambda s: _unique([v.name for v in s.volumes])),
        Rule("!has(self.eval) || self.rewards.exists(r, r.type in ['answerMatch', 'codeExec', 'environment'])",
             "needs an answerMatch, codeExec or environment reward to judge answers", ".eval",
             lambda s: s.eval is None or any(r.type in ("answerMatch", "codeExec", "environment") for r in s.rewards)),
        Rule("!has(self.volumes) || self.volumes.all(v, self.volumes.exists_one(w, w.mountPath == v.mountPath))",
             "mountPaths must be unique", ".volumes", lambda s: _unique([v.mount_path for v in s.volumes])),
        Rule("!has(self.checkpointEngine.persist) || has(self.volumes) && self.volumes.exists(v, !v.readOnly && "
             "(self.checkpointEngine.persist.path == v.mountPath || "
             "self.checkpointEngine.persist.path.startsWith(v.mountPath + '/')))",
             "must lie on a writable volume (under one of volumes[].mountPath)", ".checkpointEngine.persist.path",
             _persist_on_volume),
        Rule("!has(self.export) || has(self.volumes) && self.volumes.exists(v, !v.readOnly && "
             "(self.export.path == v.mountPath || self.export.path.startsWith(v.mountPath + '/')))",
             "must lie on a writable volume (under one of volumes[].mountPath)", ".export.path",
             _export_on_volume),
        Rule("!has(self.rollout.partial) || self.algorithm.maxStaleness == 0",
             "partial rollouts and asynchronous rollouts (maxStaleness > 0) are exclusive; choose one",
             ".algorithm.maxStaleness", lambda s: s.rollout.partial is None or s.algorithm.max_staleness == 0),
        Rule(f"!{_DYNAMIC} || !has(self.rollout.partial)",
             "dynamic sampling needs whole synchronous rollouts (no rollout.partial)", ".algorithm.dynamicSampling",
             lambda s: s.algorithm.dynamic_sampling is None or s.rollout.partial is None, **_DYNAMIC_PRESET),
        Rule(f"!{_DYNAMIC} || !self.rewards.exists(r, r.type == 'model')",
             "dynamic sampling needs rule-based rewards (a reward model would load beside the rollout to score each "
             "round)", ".algorithm.dynamicSampling",
             lambda s: s.algorithm.dynamic_sampling is None or not any(r.type == "model" for r in s.rewards),
             **_DYNAMIC_PRESET),
        Rule("self.algorithm.name != 'kto' || has(self.dataset.completionField)",
             "kto trains on labelled completions: name the field holding each row's completion",
             ".dataset.completionField", lambda s: s.algorithm.name != "kto" or s.dataset.completion_field is not None),
        Rule("self.algorithm.name != 'kto' || has(self.dataset.labelField)",
             "kto trains on labelled completions: name the field holding each row's label (true: desirable)",
             ".dataset.labelField", lambda s: s.algorithm.name != "kto" or s.dataset.label_field is not None),
        Rule("self.algorithm.name == 'kto' || !has(self.dataset.completionField)", KTO_ONLY,
             ".dataset.completionField", lambda s: s.algorithm.name == "kto" or s.dataset.completion_field is None),
        Rule("self.algorithm.name == 'kto' || !has(self.dataset.labelField)", KTO_ONLY,
             ".dataset.labelField", lambda s: s.algorithm.name == "kto" or s.dataset.label_field is None),
        Rule("!has(self.eval) || (!has(self.eval.dataset.completionField) && !has(self.eval.dataset.labelField))",
             "evaluation generates from the prompts and judges with spec.rewards: completionField and labelField "
             "do not apply", ".eval.dataset",
             lambda s: s.eval is None or (s.eval.dataset.completion_field is None
                                          and s.eval.dataset.label_field is None)),
        Rule("self.algorithm.name != 'kto' || !has(self.rollout.partial)",
             "kto generates no training completions to cut (its rollouts serve evaluation only)", ".rollout.partial",
             lambda s: s.algorithm.name != "kto" or s.rollout.partial is None),
        Rule("self.algorithm.name in ['dpo', 'kto'] || (!has(self.rollout.partial) && "
             "self.algorithm.maxStaleness == 0) || has(self.algorithm.tisCap) || "
             "has(self.algorithm.rolloutCorrection)",
             "stale samples (rollout.partial or maxStaleness > 0) need tisCap (or rolloutCorrection): the "
             "importance weights against the policy version that sampled each token", ".algorithm.tisCap",
             lambda s: s.algorithm.name in ("dpo", "kto") or (s.rollout.partial is None
                                                             and s.algorithm.max_staleness == 0)
             or s.algorithm.correction is not None),
        Rule("self.trainer.engine != 'hf' || self.algorithm.name != 'ppo' || !self.algorithm.critic",
             "PPO's learned critic (a value head on the policy's transformer) runs on the megatron engine, which "
             "hf is not: use engine megatron (or auto on a model family it maps), or drop algorithm.critic",
             ".trainer.engine", lambda s: s.trainer.engine != "hf" or s.algorithm.name != "ppo"
             or not s.algorithm.critic),
        Rule("!has(self.trainer.lora) || self.algorithm.name != 'ppo' || !self.algorithm.critic",
             "LoRA trains on the hf engine, which has no value head for PPO's learned critic: drop trainer.lora, "
             "or algorithm.critic (PPO then takes its group baseline)", ".trainer.lora",
             lambda s: s.trainer.lora is None or s.algorithm.name != "ppo" or not s.algorithm.critic),
        Rule("!has(self.trainer.lora) || self.trainer.lora.sync != 'adapter' || "
             "string(self.rollout.sleepLevel) != '2'",
             "sleep level 2 drops the base weights that trainer.lora.sync adapter serves its adapters on: use 1 "
             "(or auto), or lora.sync merged", ".rollout.sleepLevel",
             lambda s: s.trainer.lora is None or s.trainer.lora.sync != "adapter" or s.rollout.sleep_level != 2),
        Rule("!self.rewards.exists(r, r.type == 'environment') || (has(self.rollout.environment) && "
             "self.rollout.environment.type in ['custom', 'agent'])",
             "an environment reward needs rollout.environment of type custom or agent (the ones that give rewards)",
             ".rewards", lambda s: not any(r.type == "environment" for r in s.rewards) or (
                 s.rollout.environment is not None and s.rollout.environment.type in ("custom", "agent"))),
        Rule("!has(self.rollout.environment) || self.rollout.environment.type == 'single' || "
             "(!has(self.rollout.partial) && !(self.algorithm.name in ['dpo', 'kto']))",
             "multi-turn rollouts (environment types tools, custom, agent) are generated whole, synchronously or "
             "asynchronously (maxStaleness), and trained by the policy-gradient algorithms: no rollout.partial, "
             "not dpo or kto", ".rollout.environment", _multi_turn_ok),
        Rule(f"!has(self.rollout.environment) || self.rollout.environment.type == 'single' || !{_DYNAMIC}",
             "dynamic sampling regenerates single replies: multi-turn rollouts (rollout.environment types tools, "
             "custom, agent) take none", ".algorithm.dynamicSampling",
             lambda s: s.rollout.environment is None or s.rollout.environment.type == "single"
             or s.algorithm.dynamic_sampling is None, **_DYNAMIC_PRESET),
        Rule("self.algorithm.routingReplay != 'on' || (self.trainer.engine != 'hf' && !has(self.trainer.lora))",
             "routing replay feeds the rollout's routed experts into megatron's MoE routers; the hf engine (also "
             "trainer.lora's) routes by itself: use trainer.engine megatron, or routingReplay auto or off",
             ".algorithm.routingReplay", lambda s: s.algorithm.routing_replay != "on"
             or (s.trainer.engine != "hf" and s.trainer.lora is None)),
        Rule("self.algorithm.routingReplay != 'on' || !has(self.rollout.environment) || "
             "self.rollout.environment.type == 'single'",
             "multi-turn rollouts (rollout.environment tools, custom, agent) do not carry routed experts: "
             "routingReplay auto (off for them) or off", ".algorithm.routingReplay",
             lambda s: s.algorithm.routing_replay != "on" or s.rollout.environment is None
             or s.rollout.environment.type == "single"),
        *JOB_RULES,  # podTemplate's volumeMounts against spec.volumes
        *PARALLEL_RULES,  # trainer.expertParallel against the data-parallel size and the model
        *SPARE_RULES,  # rollout.spareEngine: CPU rollouts only
    )

    def _check_vision_language(self, found: str | None) -> None:
        """What a vision-language model's job cannot do yet (Python only: CEL cannot read config.json)."""
        where = f"{self.model.path} is a vision-language model (model_type {found!r})"
        if found not in VISION_FAMILIES:
            raise ValueError(f"model.path: {where}; its pictures' layout is not one the trainer prepares yet "
                             f"(trained: {', '.join(VISION_FAMILIES)})")
        if self.trainer.engine == "megatron":
            raise ValueError(f"trainer.engine: megatron does not train vision-language models ({where}); use hf, "
                             "or auto, which picks hf for it")
        if self.algorithm.name in ("dpo", "kto"):
            raise ValueError(f"algorithm.name: {self.algorithm.name} packs its own pairs or labelled rows, which carry "
                             f"no pictures ({where}); use grpo or ppo")
        env = self.rollout.environment
        if self.rollout.partial is not None:
            raise ValueError(f"rollout.partial: continued rollouts do not carry pictures yet ({where}); use whole "
                             "rollouts")
        if env is not None and env.type == "agent":
            raise ValueError(f"rollout.environment.type: agent's OpenAI endpoint takes no pictures yet ({where}); "
                             "use tools or custom, whose environments may answer with pictures")

    @model_validator(mode="after")
    def _check_engine_family(self) -> JobSpec:
        """trainer.engine megatron on a model whose config.json (where readable here) has no weight mapping, and
        PPO's critic where engine auto picks hf for such a model (Python only: CEL cannot read config.json)."""
        found = model_type(self.model.path)
        if vision_language(self.model.path):
            self._check_vision_language(found)
        elif self.trainer.freeze and found is not None:
            raise ValueError(f"trainer.freeze: {self.model.path} (model_type {found!r}) has no vision tower or "
                             "projector: freeze applies to vision-language models")
        if self.trainer.engine == "megatron" and found is not None and found not in ModelRef.FAMILIES:
            raise ValueError(f"trainer.engine: megatron has no weight mapping for model_type {found!r} of "
                             f"{self.model.path}/config.json (mapped: {', '.join(ModelRef.FAMILIES)}); "
                             "use hf, or auto, which picks hf for it")
        if (self.algorithm.name == "ppo" and self.algorithm.critic and self.trainer.engine == "auto"
                and self.model.family == "auto" and found is not None and found not in ModelRef.FAMILIES):
            raise ValueError(f"algorithm.critic: PPO's learned critic runs on the megatron engine, and engine auto "
                             f"picks hf (no value head) for model_type {found!r} of {self.model.path}/config.json, "
                             "which megatron has no weight mapping for: drop algorithm.critic (PPO then takes its "
                             "group baseline)")
        if self.algorithm.routing_replay == "on" and found is not None and found not in REPLAY_FAMILIES:
            raise ValueError(f"algorithm.routingReplay: on needs a mixture-of-experts model of a family both engines "
                             f"replay ({', '.join(REPLAY_FAMILIES)}); model_type {found!r} of {self.model.path}/"
                             "config.json is not one: use auto or off")
        return self

    def preset_note(self, rule: Rule) -> str:
        return self.algorithm.preset_note(rule)

    def trainer_ranks_per_pod(self) -> int:
        """Trainer processes in one pod: one per GPU, or TP x PP on CPU (gpusPerPod: 0)."""
        if self.gpus_per_pod:
            return self.gpus_per_pod
        return self.trainer.tensor_parallel * self.trainer.pipeline_parallel


# The mixture-of-experts families whose routing both engines replay (algorithm.routingReplay): vLLM records
# the routed experts, megatron's routers take them (tandem.sidecars.trainer.engines.routing_replay).
REPLAY_FAMILIES: tuple[str, ...] = ("mixtral",)

# Fields that cannot change once the job exists (the CRD carries `self == oldSelf` on each).
IMMUTABLE_FIELDS: tuple[str, ...] = (
    "model", "algorithm", "replicas", "gpusPerPod", "trainer", "rollout", "rewards", "reference",
    "dataset", "checkpointEngine", "volumes", "podTemplate", "gangScheduling",
)


class ObjectMeta(BaseModel):
    model_config = ConfigDict(extra="allow")
    # A DNS-1035 label (the job name is also its headless Service name), short enough for `<name>-<index>`.
    name: Annotated[str, Field(pattern=r"^[a-z]([-a-z0-9]*[a-z0-9])?$", max_length=48)]
    namespace: str = "default"
    labels: dict[str, str] = Field(default_factory=dict, description="kueue.x-k8s.io/queue-name queues the job "
                                   "in Kueue (`tandem.operator.manifests.kueue`).")


class RLHFJob(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    api_version: Literal["tandem.dev/v1alpha1"] = Field("tandem.dev/v1alpha1", alias="apiVersion")
    kind: Literal["RLHFJob"] = "RLHFJob"
    metadata: ObjectMeta
    spec: JobSpec
    status: JobStatus | None = None
