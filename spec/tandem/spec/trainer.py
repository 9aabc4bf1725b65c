"""The model and the trainer of an RLHFJob: `spec.model` (ModelRef, with the check of its config.json) and
`spec.trainer` (engine, parallelism, batch sizes, LoRA, resources).

Role: part of the job's shape, split from models.py (which re-exports every name here). Callers: models.py
(JobSpec), `tandem.spec.devices` (the engine auto resolves to), the sidecars through JobSpec.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field, model_validator

from tandem.spec.strict_model import IMAGE, Base, Quantity, Rule


def _config(path: str) -> dict[str, object] | None:
    """config.json of the model at `path`, or None where it cannot be read here (in a cluster the path often
    exists only in the pods; a relative path is resolved after parsing) or is not a JSON object."""
    import json
    from pathlib import Path

    if not path.startswith("/"):
        return None
    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def model_type(path: str) -> str | None:
    """config.json's model_type of the model at `path`, or None where the file cannot be read here (`_config`)."""
    value = (_config(path) or {}).get("model_type")
    return value if isinstance(value, str) else None


IMAGE_TOKEN_BIAS = -100.0  # added to a vision-language model's image-token logit where it samples and is scored


def image_token(config: object) -> int | None:
    """A vision-language model's image token id from its (transformers or vLLM hf_config) config: image_token_id,
    or image_token_index as older LLaVA configs name it; None for a text model. Read by the rollout engine and the
    hf trainer engine, which push that token's logit down alike."""
    if getattr(config, "vision_config", None) is None:
        return None
    token = getattr(config, "image_token_id", None)
    token = getattr(config, "image_token_index", None) if token is None else token
    return int(token) if isinstance(token, int) else None


def vision_language(path: str) -> bool:
    """True when config.json at `path` describes a vision-language model (it has a vision_config); False also
    where the file cannot be read here (`_config`)."""
    return isinstance((_config(path) or {}).get("vision_config"), dict)


def _family_problem(path: str, family: str) -> str | None:
    """Why `family` does not fit `path`/config.json ("field: message"), or None (also when the file cannot
    be read: see `model_type`; whether a Megatron mapping exists is JobSpec's rule, by trainer.engine)."""
    import json
    from pathlib import Path

    if not path.startswith("/"):
        return None
    file = Path(path) / "config.json"
    try:
        config = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError):
        return None
    except ValueError as e:
        return f"path: {file} is not valid JSON ({e})"
    if not isinstance(config, dict):
        return f"path: {file} is not a JSON object"
    found = config.get("model_type")
    if not isinstance(found, str) or not found:
        return f"family: model_type {found!r} of {file} (architectures {config.get('architectures')}) names no model"
    if family not in ("auto", found):
        return f"family: {family!r} does not match model_type {found!r} of {file} (use auto or {found})"
    return None


class ModelRef(Base):
    """The policy model: a HuggingFace directory and its weight-mapping family."""

    # The families with a Megatron weight mapping (tandem.checkpoint_engine.convert); any other model_type trains
    # on trainer.engine hf. Checked against path/config.json where it is readable here (tandem validate / run).
    FAMILIES: ClassVar[tuple[str, ...]] = ("llama", "mixtral", "qwen2", "qwen3")
    path: Annotated[str, Field(min_length=1, description="HuggingFace model directory (PVC/hostPath in a cluster).")]
    family: Literal["auto", "llama", "mixtral", "qwen2", "qwen3"] = Field(
        default="auto", description="Megatron weight-mapping family; auto reads config.json's model_type (which, "
        "where readable when the job is validated, must match this one). A model of another family trains on "
        "trainer.engine hf, with family auto.")

    @model_validator(mode="after")
    def _check_family(self) -> ModelRef:
        problem = _family_problem(self.path, self.family)
        if problem is not None:
            raise ValueError(problem)
        return self


class Resources(Base):
    cpu: Quantity = "8"
    memory: Quantity = "64Gi"


class Lora(Base):
    """Low-rank adapters (PEFT's LoRA) trained on the frozen model: Adam's state for the adapters only."""

    rank: Annotated[int, Field(ge=1, le=4096, description="Rank r of each adapter (B A, A: r x in, B: out x r).")] = 16
    alpha: Annotated[float, Field(gt=0, le=1e6, description="The update is alpha / rank x B A.")] = 32.0
    target_modules: Annotated[list[Annotated[str, Field(min_length=1, max_length=128)]], Field(
        min_length=1, max_length=64, description="Module names to adapt (q_proj, v_proj, ...), or [all-linear]: "
        "every linear layer but the output layer. On a vision-language model, its language model's only.")] = \
        Field(default_factory=lambda: ["all-linear"])
    dropout: Annotated[float, Field(ge=0, lt=1, description="Dropout on the adapters' input.")] = 0.0
    sync: Literal["adapter", "merged"] = Field(default="adapter", description=(
        "What a version carries to the rollouts. adapter: the adapters alone (a few MB), which vLLM serves as "
        "a LoRA adapter over the base model it loads from model.path (rank at most 512; rollout.sleepLevel 1). "
        "merged: the whole model with the adapters merged in (W + alpha / rank x B A), for models vLLM serves "
        "no LoRA for."))
    rules = (
        Rule("self.sync != 'adapter' || self.rank <= 512", "sync adapter: vLLM serves LoRA ranks up to 512; "
             "use a smaller rank or sync merged", ".rank", lambda x: x.sync != "adapter" or x.rank <= 512),
    )


class Trainer(Base):
    image: Annotated[str, Field(pattern=IMAGE)] = "ghcr.io/tandem-rl/trainer:0.1.0"
    engine: Literal["auto", "megatron", "hf"] = Field(default="auto", description=(
        "The training engine. megatron: Megatron-core, tensor, pipeline, expert and data parallel, for the families "
        "with a weight mapping (model.family). hf: transformers with torch FSDP2, data parallel only (each rank "
        "holds 1/N of the weights, gradients and Adam's state), for any causal LM that transformers and vLLM "
        "load, its own state dict published as is; no PPO critic. auto: megatron where config.json's model_type "
        "has a mapping, hf otherwise."))
    tensor_parallel: Annotated[int, Field(ge=1, le=64)] = 1
    pipeline_parallel: Annotated[int, Field(ge=1, le=64)] = 1
    expert_parallel: Annotated[int, Field(ge=1, le=64, description=(
        "Expert parallelism of a mixture-of-experts model (model.family mixtral): each group of expertParallel "
        "data-parallel ranks splits the experts among them; it must divide the data-parallel size and the "
        "number of experts."))] = 1
    global_batch_size: Annotated[int, Field(ge=1, le=1_000_000)] = 64
    micro_batch_size: Annotated[int, Field(ge=1, le=65_536)] = 8
    micro_batch_tokens: Annotated[int | None, Field(ge=1, le=1 << 24, description=(
        "At most this many tokens (packed rows x row length) per micro-batch: fewer rows than "
        "microBatchSize when rows are long, never fewer than one. Activations, the largest part of a "
        "train step's memory, grow with it; unset: microBatchSize rows whatever their length."))] = None
    offload: bool = True
    distributed_optimizer: bool = Field(default=True, description=(
        "Megatron's distributed optimizer: Adam's moments and the fp32 master weights are sharded over the "
        "data-parallel ranks (each holds 1/dp of them) and gradients are reduce-scattered; the same updates as "
        "the unsharded optimizer. false keeps a full copy on every data-parallel rank."))
    process_group_timeout_minutes: Annotated[int, Field(ge=1, le=10_080, description=(
        "Timeout of the trainer's collectives (NCCL on GPUs); ranks wait for rollouts and evaluations on a host "
        "group of their own, so only real collectives (gradients, exports) count against it."))] = 120
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto", description="Weights and compute of the trainer, and the dtype of the rollout's vLLM, which "
        "loads the published weights only in its own dtype: auto is bfloat16 with gpusPerPod > 0, float32 on CPU.")
    share_prompts: bool = Field(default=True, description=(
        "Pack a group's prompt once per row: its completions attend to that one copy (attention mask), "
        "so every forward and backward computes the prompt once per group instead of once per completion. "
        "Log-probs and gradients are those of one copy per completion."))
    activation_checkpointing: bool = Field(default=False, description=(
        "Each transformer layer keeps only its input for the backward and computes its forward again there "
        "(Megatron's full recompute): a train step's activations shrink from every layer's to one layer's, "
        "for about a third more compute. With rows longer than 512 tokens, which attend one sample at a time "
        "(memory linear in the row), it is what lets long sequences train: bench/long_sequences.py."))
    lora: Lora | None = Field(default=None, description=(
        "Train LoRA adapters instead of every weight (the hf engine, which auto then picks). Each version "
        "carries the adapters alone (lora.sync adapter: vLLM serves them as a LoRA adapter) or the merged "
        "weights (merged); spec.export writes the adapters as a PEFT adapter directory (adapter/ in each "
        "exported model directory) beside the merged model."))
    freeze: Annotated[list[Literal["visionTower", "projector"]], Field(max_length=2, description=(
        "A vision-language model's parts left as they are: its vision tower, its projector (the layers that map "
        "the tower's features into the language model), or both; the rest trains. Empty: the whole model "
        "trains. With trainer.lora the adapters alone train (on the language model's layers) whatever this "
        "says."))] = Field(default_factory=list)
    resources: Resources = Field(default_factory=Resources)
    rules = (
        Rule("self.globalBatchSize % self.microBatchSize == 0", "globalBatchSize must be a multiple of microBatchSize",
             ".globalBatchSize", lambda t: t.global_batch_size % t.micro_batch_size == 0),
        Rule("self.engine != 'hf' || (self.tensorParallel == 1 && self.pipelineParallel == 1 && "
             "self.expertParallel == 1)", "the hf engine is data parallel only (FSDP2): tensorParallel, "
             "pipelineParallel and expertParallel must be 1", ".engine",
             lambda t: t.engine != "hf" or (t.tensor_parallel, t.pipeline_parallel, t.expert_parallel) == (1, 1, 1)),
        Rule("!has(self.lora) || self.engine != 'megatron'", "LoRA trains on the hf engine (engine hf or auto)",
             ".lora", lambda t: t.lora is None or t.engine != "megatron"),
        Rule("!has(self.lora) || (self.tensorParallel == 1 && self.pipelineParallel == 1 && "
             "self.expertParallel == 1)", "LoRA trains on the hf engine, which is data parallel only: "
             "tensorParallel, pipelineParallel and expertParallel must be 1", ".lora",
             lambda t: t.lora is None or (t.tensor_parallel, t.pipeline_parallel, t.expert_parallel) == (1, 1, 1)),
    )
