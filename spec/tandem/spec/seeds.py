"""The seeds a job derives from its one `spec.seed`, so that every random draw of a run follows from it.

Role: pure functions, one per consumer. The prompt order (`PromptDataset`) and the trainer's initialisation
(`build_engine`) take `spec.seed` itself; each pod's vLLM engine takes `engine_seed` (pods sample apart from
each other, and the single-pod job with seed 0 keeps engine seed 0); every generate request of iteration or
batch b takes `request_seed` (b itself with seed 0), from which the rollout client gives each rollout's slice
and the rollout engine each prompt its own (`tandem.sidecars.rollout_engine.sampling.slice_seed`, `prompt_seeds`).
Callers: trainer.loop.phases.generate, trainer.loop.rollout.async_rollouts, rollout.__main__.
"""

from __future__ import annotations

LIMIT = 2**31  # vLLM and torch take seeds below this


def engine_seed(seed: int, pod_index: int, rollout_only: bool) -> int:
    """The vLLM engine seed of pod `pod_index` (hybrid and rollout-only pods are indexed apart)."""
    return (seed * 65_537 + 2 * pod_index + int(rollout_only)) % LIMIT


def request_seed(seed: int, index: int) -> int:
    """The seed of the generate requests of iteration (or asynchronous batch) `index`."""
    return (seed * 1_000_003 + index) % LIMIT

