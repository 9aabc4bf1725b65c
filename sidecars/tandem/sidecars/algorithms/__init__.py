"""RL algorithms (GRPO default, PPO, DPO, KTO) and sequence packing, in pure torch (no engine imports).

Callers: the driver (`make_algorithm(spec.algorithm)`, `Sample`, `pack_samples`) and the trainer
engine (`Algorithm.loss(logprobs, micro_batch)`, `token_logprobs`, `PackedBatch`). See `algorithm_interface` for
the per-iteration flow, `algorithm_choice` for the one place choosing an algorithm and `packing` for the token
alignment convention.
"""

from tandem.sidecars.algorithms import algorithm_choice, algorithm_interface, dpo, functional, grpo, kto, packing, ppo
from tandem.sidecars.algorithms.algorithm_choice import make_algorithm
from tandem.sidecars.algorithms.algorithm_interface import (
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

__all__ = [
    "DPO", "GRPO", "KTO", "PPO", "Algorithm", "AlgorithmError", "Metrics", "PackedBatch", "PackingError",
    "Placement", "Sample", "algorithm_choice", "algorithm_interface", "dpo", "functional", "grpo", "kto",
    "make_algorithm", "pack", "pack_samples", "packing", "ppo", "preference_pairs", "token_logprobs",
]
