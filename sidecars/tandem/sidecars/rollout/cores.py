"""How many of a CPU pod's cores vLLM keeps for its engine loop (`VLLM_CPU_NUM_OF_RESERVED_CPU`).

Role: vLLM on CPU reserves one core for its engine-core process by default and computes on the
others: on a 2-core pod, generation then runs on one core. Measured on a 2-core machine here
(SmolLM2-135M, 32 completions x 48 tokens): 97 tokens/s with the default, 170-180 with
no reserved core — the engine loop takes ~6% of a core while the model computes. That holds while
nothing else computes on the pod: the hybrid deployment's rollout generates while its trainer
waits (synchronous and partial rollouts) and a rollout-only pod has its cores to itself. With
asynchronous rollouts on the hybrid pods themselves (`algorithm.maxStaleness` > 0 and
`rollout.betweenRollouts: keep`), vLLM generates while the trainer trains, and its compute
threads would contend with the trainer's for every core: vLLM's default stays. A pod with one core
also keeps the default. An explicit VLLM_CPU_NUM_OF_RESERVED_CPU in the pod's env always wins; `tandem
run` sets the default explicitly where several pods share the machine's cores (not `--pin-pods`).
Ignored on GPUs. Caller: `tandem.sidecars.rollout.__main__`.
"""

from __future__ import annotations

from tandem.spec.models import JobSpec


def reserved_cores(spec: JobSpec, *, rollout_only: bool, cores: int) -> int | None:
    """0 when this rollout may compute on every core of its pod, None for vLLM's default."""
    if cores < 2:
        return None
    overlaps_training = spec.algorithm.max_staleness > 0 and spec.rollout.between_rollouts == "keep"
    return 0 if rollout_only or not overlaps_training else None
