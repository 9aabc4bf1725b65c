"""The reference policy as a frozen copy of weights swapped into the trainer's own model (either engine).

Role: KL needs log-probs under the reference model. Instead of a second model on the
accelerator, the reference weights live in host memory (this rank's shards only) and are swapped
in for the reference forward, then the policy weights are swapped back: the "reload reference
only when needed" phase of the VRAM plan, with Megatron's numerics and parallelism for free.
Callers: `tandem.sidecars.trainer.loop.start` (capture), `.inference` (the Inference phase).
Collective like every forward.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from tandem.sidecars.trainer.engines.interface import TrainerEngine


class ReferenceWeights:
    def __init__(self, engine: TrainerEngine, weights: dict[str, torch.Tensor]):
        self.engine = engine
        self.weights = weights

    @classmethod
    def capture(cls, engine: TrainerEngine, path: str | None = None) -> ReferenceWeights:
        """Snapshot the engine's current weights, or (with `path`) the weights of another HF dir."""
        params = dict(engine.named_parameters())
        if path is None:
            return cls(engine, {n: p.detach().to("cpu", copy=True) for n, p in params.items()})
        policy = {n: p.detach().to("cpu", copy=True) for n, p in params.items()}
        engine.load_hf_weights(Path(path))
        ref = {n: p.detach().to("cpu", copy=True) for n, p in params.items()}
        _copy_into(params, policy)
        return cls(engine, ref)

    @contextmanager
    def swapped_in(self) -> Iterator[None]:
        params = dict(self.engine.named_parameters())
        policy = {n: p.detach().to("cpu", copy=True) for n, p in params.items()}
        _copy_into(params, self.weights)
        try:
            yield
        finally:
            _copy_into(params, policy)

    def token_logprobs(self, batch: Any, scored_only: bool = False) -> torch.Tensor:
        with self.swapped_in():
            return self.engine.token_logprobs(batch, scored_only=scored_only)


def _copy_into(params: dict[str, torch.Tensor], source: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(source[name].to(p.device))
