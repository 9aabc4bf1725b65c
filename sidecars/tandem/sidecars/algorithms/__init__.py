"""RL algorithms (GRPO default, PPO, DPO, KTO) and sequence packing, in pure torch (no engine imports).

Callers: the driver (`make_algorithm(spec.algorithm)`, `Sample`, `pack_samples`) and the trainer
engine (`Algorithm.loss(logprobs, micro_batch)`, `token_logprobs`, `PackedBatch`). See `base` for the
per-iteration flow and `packing` for the token alignment convention.
"""

from tandem.sidecars.algorithms import base, dpo, functional, grpo, kto, packing, ppo, registry
from tandem.sidecars.algorithms.base import (
    Algorithm,
    AlgorithmError,
    Metrics,
    Sample,
    pack_samples,
)
from tandem.sidecars.algorithms.dpo import DPO, preference_pairs
from tandem.sidecars.algorithms.grpo import GRPO
from tandem.sidecars.algorithms.kto import KTO
from tandem.sidecars.algorithms.packing import PackedBatch, PackingError, Placement, pack, token_logprobs
from tandem.sidecars.algorithms.ppo import PPO
from tandem.sidecars.algorithms.registry import make_algorithm

__all__ = [
    "DPO", "GRPO", "KTO", "PPO", "Algorithm", "AlgorithmError", "Metrics", "PackedBatch", "PackingError",
    "Placement", "Sample", "base", "dpo", "functional", "grpo", "kto", "make_algorithm", "pack", "pack_samples",
    "packing", "ppo", "preference_pairs", "registry", "token_logprobs",
]
