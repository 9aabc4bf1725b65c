"""What a rollout is asked and what it returns (pydantic): sampling options, completions, per-prompt seeds.

Callers: the rollout engine (engine.py, turns.py) takes and returns them; the rollout sidecar's routes, the
multi-turn driver and the agents' recorder (tandem.sidecars.envs), and the trainer's rollout client and
sources send and read them. Imports nothing of vLLM: the trainer's image imports it too.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any, Literal

from pydantic import BaseModel, Field


class SamplingOptions(BaseModel):
    """The subset of vLLM's SamplingParams the RL loop uses."""

    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=-1, ge=-1)
    max_tokens: int = Field(default=64, ge=1)
    min_tokens: int = Field(default=0, ge=0)
    seed: int | None = None
    stop: list[str] = Field(default_factory=list)
    stop_token_ids: list[int] = Field(default_factory=list)
    ignore_eos: bool = False


def prompt_seeds(seed: int, count: int) -> list[int]:
    """One seed per prompt of a request seeded `seed`, unrelated to each other and to other requests': vLLM
    seeds a prompt's n samples s .. s+n-1, so prompts sharing the request's seed would draw the same random
    numbers, and seed + i would reuse the next prompt's. The rollout engine seeds each prompt so; the
    rollout client gives each rollout's slice of a request a seed of its own (`slice_seed`)."""
    return [_seed_of(f"{seed}:{i}") for i in range(count)]


def slice_seed(seed: int, offset: int) -> int:
    """The seed of the slice of a request that starts at prompt `offset` (the request's own at 0)."""
    return seed if offset == 0 else _seed_of(f"{seed}/{offset}")


def _seed_of(text: str) -> int:
    """A seed below 2**31 (vLLM's and torch's bound) hashed from `text`: nearby inputs, unrelated seeds."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=4).digest(), "big") % 2**31


class RoutedExperts(BaseModel):
    """Routing replay (MoE): the experts each token of prompt + completion was routed to in every MoE layer,
    `[tokens, layers, topk]` C-ordered, base64 on the wire (uint8 up to 255 experts: layers x topk bytes a
    token). `tokens` is prompt + completion - 1: vLLM runs no forward on the last sampled token."""

    shape: tuple[int, int, int]
    dtype: Literal["uint8", "uint16"]
    data: str  # base64 of the array's bytes

    @classmethod
    def of(cls, raw: bytes, shape: tuple[int, int, int], dtype: Literal["uint8", "uint16"]) -> RoutedExperts:
        return cls(shape=shape, dtype=dtype, data=base64.b64encode(raw).decode("ascii"))

    def array(self) -> Any:
        """The routing as a numpy array of `shape` and `dtype`."""
        import numpy as np

        return np.frombuffer(base64.b64decode(self.data), dtype=self.dtype).reshape(self.shape)

    def nbytes(self) -> int:
        return self.shape[0] * self.shape[1] * self.shape[2] * (1 if self.dtype == "uint8" else 2)


class Completion(BaseModel):
    """One sampled completion: token ids and the log-prob of each sampled token (and, with routing replay,
    each token's routed experts)."""

    prompt_index: int
    sample_index: int
    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str | None = None
    routed_experts: RoutedExperts | None = None  # algorithm.routingReplay: the experts of each token
