"""The trainer-engine interface, and the engine a job's spec asks for.

Role: the driver (`context.TrainerContext`) trains through one interface, drawn from what it calls:
load (`from_hf`), log-probs (policy, reference, values), a train step, offload and onload around the
rollout, export of HF-named weights (publish, durable copies, export dirs) and loading them back
(reference weights, resume). Two implementations: `megatron_engine.MegatronEngine` (tensor, pipeline,
expert and data parallel; the families of `checkpoint_engine.convert`) and `hf_engine.HFEngine`
(transformers + FSDP2, data parallel; any causal LM transformers loads). `build_engine` picks one by
`trainer.engine` (auto: megatron where a weight mapping exists, `spec.devices.trainer_engine`).
Caller: `TrainerContext.create`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal, Protocol

import torch

from tandem.sidecars.trainer.engines.megatron_build import Parallelism
from tandem.spec import devices
from tandem.spec.models import JobSpec

LossFn = Callable[[torch.Tensor, Any], tuple[torch.Tensor, Mapping[str, Any]]]


class Shape(Protocol):
    """What the loop reads of the model's architecture."""

    @property
    def family(self) -> str: ...
    @property
    def hidden(self) -> int: ...
    @property
    def vocab(self) -> int: ...
    @property
    def tie_embeddings(self) -> bool: ...


class TrainerEngine(Protocol):
    """One trainer engine. Every method that touches the model is collective over the job's ranks."""

    shape: Any  # a `Shape`
    par: Parallelism
    model: Any  # the wrapped model (Megatron's DDP module, or the FSDP2-sharded transformers model)
    optimizer: Any
    last_step_rows: int
    last_export_seconds: float

    def token_logprobs(self, batch: Any, micro_batch_size: int | None = None,
                       scored_only: bool = False) -> torch.Tensor: ...
    def logits(self, batch: Any) -> torch.Tensor: ...
    def train_step(self, batch: Any, loss_fn: LossFn, micro_batch_size: int | None = None,
                   reduction: Literal["mean", "sum"] = "mean") -> dict[str, float]: ...
    def set_lr(self, lr: float) -> None: ...
    def offload(self) -> dict[str, float]: ...
    def onload(self) -> dict[str, float]: ...
    def export_hf(self, target_tp: int = 1, target_rank: int = 0) -> Iterator[tuple[str, torch.Tensor]]: ...
    def save_hf(self, out_dir: str | Path, config_dir: str | Path) -> Path: ...
    def load_hf_weights(self, source: Path | Callable[[str], torch.Tensor]) -> int: ...
    def named_parameters(self) -> Iterator[tuple[str, torch.Tensor]]: ...
    @property
    def is_export_rank(self) -> bool: ...


def build_engine(spec: JobSpec, seed: int = 0, value_head: bool = False) -> TrainerEngine:
    """The policy's engine (or PPO's critic, with `value_head`: Megatron only) as the spec lays it out:
    trainer.engine, tensorParallel, pipelineParallel, expertParallel, distributedOptimizer,
    activationCheckpointing, lora, in trainer.dtype (which the rollout's vLLM runs too)."""
    t = spec.trainer
    dtype = getattr(torch, devices.trainer_dtype(spec))
    common: dict[str, Any] = dict(lr=spec.algorithm.lr, seed=seed, dtype=dtype, micro_batch_size=t.micro_batch_size,
                                  micro_batch_tokens=t.micro_batch_tokens, value_head=value_head,
                                  recompute=t.activation_checkpointing)
    if devices.trainer_engine(spec) == "hf":
        from tandem.sidecars.trainer.engines.hf_engine import HFEngine

        return HFEngine.from_hf(spec.model.path, lora=t.lora, **common)
    from tandem.sidecars.trainer.engines.megatron_engine import MegatronEngine

    return MegatronEngine.from_hf(spec.model.path, tensor_parallel=t.tensor_parallel,
                                  pipeline_parallel=t.pipeline_parallel, expert_parallel=t.expert_parallel,
                                  distributed_optimizer=t.distributed_optimizer, **common)
