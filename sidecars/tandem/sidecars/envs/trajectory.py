"""One multi-turn trajectory as tokens: the model's segments (sampled ids, their log-probs, the weight version
that sampled them) between the environment's (tool results, observations, the next generation prompt).

Role: what a multi-turn rollout hands the trainer. The completion is every segment after the first prompt,
in order; the loss mask is 1 on the model's tokens and 0 on the environment's, whose log-probs are 0;
`turn_starts` are the completion offsets where each model turn begins (for per-turn rewards and metrics);
each token's version lets staleness and TIS work per segment, as partial rollouts already do.
Pictures (vision-language models): the first prompt's and each environment segment's, each one image placeholder
in the ids (what vLLM is sent) and its own count of image tokens once vLLM expands it (`picture_tokens`);
`expanded` gives the ids, mask and log-probs as vLLM and the trainer hold them, each placeholder as its tokens.
Caller: the rollout's multi-turn driver (built turn by turn), the trainer (to a Sample).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Segment:
    ids: list[int]
    model: bool  # sampled by the model (trained) or written by the environment (not)
    logprobs: list[float] | None = None  # the rollout's, one per id (model segments)
    version: int | None = None  # the weight version that sampled it (model segments)
    pictures: tuple[Any, ...] = ()  # the environment's, one per image placeholder in `ids`, in order
    picture_tokens: tuple[int, ...] = ()  # the image tokens each of them becomes


@dataclass(frozen=True)
class Expanded:
    """A trajectory as vLLM and the trainer hold it: each picture's placeholder as its image tokens."""

    prompt_ids: list[int]
    completion_ids: list[int]
    mask: list[int]
    logprobs: list[float]


def expand(ids: Sequence[int], counts: Sequence[int], image_token: int | None) -> list[int]:
    """`ids` with the i-th `image_token` repeated `counts[i]` times; ValueError when the placeholders and the
    counts differ in number."""
    if not counts:
        return list(ids)
    at = [i for i, t in enumerate(ids) if t == image_token]
    if len(at) != len(counts):
        raise ValueError(f"{len(at)} image placeholders for {len(counts)} pictures")
    out: list[int] = []
    k = 0
    for t in ids:
        if t == image_token:
            out.extend([t] * counts[k])
            k += 1
        else:
            out.append(t)
    return out


@dataclass
class Trajectory:
    prompt_ids: list[int]
    segments: list[Segment] = field(default_factory=list)
    prompt_pictures: tuple[Any, ...] = ()  # the first prompt's, one per image placeholder in prompt_ids
    prompt_picture_tokens: tuple[int, ...] = ()

    def add_model(self, ids: list[int], logprobs: list[float], version: int) -> None:
        if len(ids) != len(logprobs):
            raise ValueError(f"a model segment needs one log-prob per token: {len(ids)} ids, {len(logprobs)}")
        self.segments.append(Segment(list(ids), True, list(logprobs), version))

    def add_env(self, ids: list[int], pictures: Sequence[Any] = (), picture_tokens: Sequence[int] = ()) -> None:
        if len(pictures) != len(picture_tokens):
            raise ValueError(f"{len(pictures)} pictures with {len(picture_tokens)} token counts")
        self.segments.append(Segment(list(ids), False, pictures=tuple(pictures), picture_tokens=tuple(picture_tokens)))

    @property
    def pictures(self) -> tuple[Any, ...]:
        """Every picture of the conversation, in the order of its placeholders: the first prompt's, then each
        environment segment's."""
        return self.prompt_pictures + self.env_pictures

    @property
    def env_pictures(self) -> tuple[Any, ...]:
        return tuple(p for s in self.segments for p in s.pictures)

    @property
    def picture_tokens(self) -> int:
        """The tokens the pictures' placeholders add once expanded (vLLM's prompt is this much longer)."""
        counts = self.prompt_picture_tokens + tuple(n for s in self.segments for n in s.picture_tokens)
        return sum(counts) - len(counts)

    @property
    def completion_length(self) -> int:
        """The completion's tokens with the environment's pictures as their image tokens."""
        return len(self.completion_ids) + sum(n - 1 for s in self.segments for n in s.picture_tokens)

    def expanded(self, image_token: int | None) -> Expanded:
        """The trajectory as vLLM and the trainer hold it: each picture's placeholder as its image tokens (the
        environment's, so masked out and with log-prob 0); its loss mask (1 on the model's tokens) and the rollout's
        log-probs (0 on the environment's). A text trajectory's ids are its own (`image_token` None)."""
        prompt = expand(self.prompt_ids, self.prompt_picture_tokens, image_token)
        ids: list[int] = []
        mask: list[int] = []
        logprobs: list[float] = []
        for s in self.segments:
            seg = expand(s.ids, s.picture_tokens, image_token)
            ids.extend(seg)
            mask.extend([int(s.model)] * len(seg))
            logprobs.extend(s.logprobs if s.model and s.logprobs else [0.0] * len(seg))
        return Expanded(prompt, ids, mask, logprobs)

    @property
    def completion_ids(self) -> list[int]:
        return [t for s in self.segments for t in s.ids]

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
