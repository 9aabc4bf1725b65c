"""The engine a job's spec asks for: `trainer.engine` (auto resolved by `spec.devices.trainer_engine`: hf with
trainer.lora or for a model_type Megatron has no mapping for, megatron otherwise) in the spec's layout.
Caller: `loop.start.create`.
"""

from __future__ import annotations

from typing import Any

import torch

from tandem.sidecars.trainer.engines.interface import TrainerEngine
from tandem.spec import devices
from tandem.spec.models import JobSpec


def build_engine(spec: JobSpec, seed: int = 0, value_head: bool = False) -> TrainerEngine:
    """The policy's engine (or PPO's critic, with `value_head`: Megatron only) as the spec lays it out:
    trainer.engine, tensorParallel, pipelineParallel, expertParallel, distributedOptimizer,
    activationCheckpointing, lora, in trainer.dtype (which the rollout's vLLM runs too); megatron with
    algorithm.routingReplay (resolved by `spec.devices.routing_replay`) replays the samples' routed experts."""
    t = spec.trainer
    dtype = getattr(torch, devices.trainer_dtype(spec))
    common: dict[str, Any] = dict(lr=spec.algorithm.lr, seed=seed, dtype=dtype, micro_batch_size=t.micro_batch_size,
                                  micro_batch_tokens=t.micro_batch_tokens, value_head=value_head,
                                  recompute=t.activation_checkpointing)
    if devices.trainer_engine(spec) == "hf":
        from tandem.sidecars.trainer.engines.hf_engine import HFEngine

        return HFEngine.from_hf(spec.model.path, lora=t.lora, frozen=tuple(t.freeze), **common)
    from tandem.sidecars.trainer.engines.megatron_engine import MegatronEngine

    return MegatronEngine.from_hf(spec.model.path, tensor_parallel=t.tensor_parallel,
                                  pipeline_parallel=t.pipeline_parallel, expert_parallel=t.expert_parallel,
                                  distributed_optimizer=t.distributed_optimizer,
                                  routing_replay=devices.routing_replay(spec), **common)
