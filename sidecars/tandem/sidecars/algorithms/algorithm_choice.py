"""The one place choosing an algorithm: the job's `algorithm.name` -> its class, configured from the spec.

Role: sits above the algorithm modules (they import `algorithm_interface`, never this), so no import cycle joins
them. Caller: the trainer's start (`loop.start.create`:
`make_algorithm(spec.algorithm, pad_id=..., share_prompts=...)`), tests.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tandem.sidecars.algorithms.algorithm_interface import Algorithm, AlgorithmError
from tandem.sidecars.algorithms.dpo import DPO
from tandem.sidecars.algorithms.grpo import GRPO
from tandem.sidecars.algorithms.kto import KTO
from tandem.sidecars.algorithms.ppo import PPO

if TYPE_CHECKING:
    from tandem.spec.models import Algorithm as AlgorithmSpec

CLASSES: dict[str, type[GRPO] | type[PPO] | type[DPO] | type[KTO]] = {"grpo": GRPO, "ppo": PPO, "dpo": DPO,
                                                                    "kto": KTO}


def make_algorithm(spec: AlgorithmSpec, *, pad_id: int = 0, share_prompts: bool = False,
                   max_tokens: int | None = None) -> Algorithm:
    """The algorithm named by `spec.name` (grpo | ppo | dpo | kto), configured from the spec (its preset
    already expanded by the spec's loader); `max_tokens` is rollout.maxTokens (overlong shaping,
    truncation, seq-mean-token-sum-norm's divisor).

    Knobs the spec does not carry (PPO's whitening) keep their documented defaults; build the class
    directly to change them.
    """
    if spec.name not in CLASSES:
        raise AlgorithmError(f"algorithm.name: unknown algorithm {spec.name!r}")
    return CLASSES[spec.name].from_spec(spec, pad_id=pad_id, share_prompts=share_prompts, max_tokens=max_tokens)
