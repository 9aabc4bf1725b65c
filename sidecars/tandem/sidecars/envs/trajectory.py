"""One multi-turn trajectory as tokens: the model's segments (sampled ids, their log-probs, the weight version
that sampled them) between the environment's (tool results, observations, the next generation prompt).

Role: what a multi-turn rollout hands the trainer. The completion is every segment after the first prompt,
in order; the loss mask is 1 on the model's tokens and 0 on the environment's, whose log-probs are 0;
`turn_starts` are the completion offsets where each model turn begins (for per-turn rewards and metrics);
each token's version lets staleness and TIS work per segment, as partial rollouts already do.
Caller: the rollout's multi-turn driver (built turn by turn), the trainer (to a Sample).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Segment:
    ids: list[int]
    model: bool  # sampled by the model (trained) or written by the environment (not)
    logprobs: list[float] | None = None  # the rollout's, one per id (model segments)
    version: int | None = None  # the weight version that sampled it (model segments)


@dataclass
class Trajectory:
    prompt_ids: list[int]
    segments: list[Segment] = field(default_factory=list)

    def add_model(self, ids: list[int], logprobs: list[float], version: int) -> None:
        if len(ids) != len(logprobs):
            raise ValueError(f"a model segment needs one log-prob per token: {len(ids)} ids, {len(logprobs)}")
        self.segments.append(Segment(list(ids), True, list(logprobs), version))

    def add_env(self, ids: list[int]) -> None:
        self.segments.append(Segment(list(ids), False))

    @property
    def completion_ids(self) -> list[int]:
        return [t for s in self.segments for t in s.ids]

    @property
    def loss_mask(self) -> list[int]:
        return [int(s.model) for s in self.segments for _ in s.ids]

    @property
    def rollout_logprobs(self) -> list[float]:
        return [lp for s in self.segments for lp in (s.logprobs if s.model and s.logprobs else [0.0] * len(s.ids))]

    @property
    def versions(self) -> list[int | None]:
        return [s.version for s in self.segments for _ in s.ids]

    @property
    def turn_starts(self) -> list[int]:
        starts, offset = [], 0
        for s in self.segments:
            if s.model:
                starts.append(offset)
            offset += len(s.ids)
        return starts

    @property
    def model_turns(self) -> int:
        return sum(s.model for s in self.segments)
