"""The common interface of the RL algorithms, the sample record, and the one place choosing them.

Role: `Algorithm` is the Protocol the driver and the trainer engine program against (the
algorithms import this module; `algorithm_choice.make_algorithm` above them picks one). Callers: the driver
(prepare after rollouts and rewards), the Megatron engine (calls `loss` per micro-batch).

Flow per iteration:
1. the rollout returns `Sample`s (prompt/completion token ids, the sampler's log-probs);
2. the driver fills `reward`, and, if the algorithm asks for them (`needs_reference`,
   `needs_old_logprobs`, `needs_values`), `ref_logprobs`/`old_logprobs`/`values` per completion
   token — computed on `pack_samples(samples, budget)` and brought back with `PackedBatch.unpack`;
3. `batch = algo.prepare(samples, token_budget)` packs and attaches the algorithm's fields;
4. the engine runs its forward on `batch.split(n)` micro-batches, computes
   `logprobs = token_logprobs(logits, mb.labels)` and calls `algo.loss(logprobs, mb)`; summing
   the micro-batch losses (no further division) gives the whole batch's loss. A part that is its
   own optimizer step should be `part.normalised()` (weights summing to 1 over the part).
   Without `old_logprobs` the ratio is 1 (exact for one gradient step per rollout); pass them
   when taking several steps or epochs on the same samples, so that clipping can act.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from tandem.sidecars.algorithms import pictures
from tandem.sidecars.algorithms.packing import PackedBatch, pack, shared_row_budget

SHARED_ROW_CAP = 1024  # row_budget's limit on a row that holds a whole group


class AlgorithmError(ValueError):
    """The samples do not carry what the algorithm needs (missing reference log-probs, …)."""


@dataclass
class Sample:
    """One completion of one prompt, as the driver hands it to an algorithm.

    Per-token lists have one entry per completion token: entry j is about `completion_ids[j]`.
    """

    prompt_ids: list[int]
    completion_ids: list[int]
    group: int  # index of the prompt; the group_size completions of a prompt share it
    reward: float = 0.0
    old_logprobs: list[float] | None = None  # policy that generated it (rollout or trainer forward)
    ref_logprobs: list[float] | None = None  # reference model
    values: list[float] | None = None  # PPO critic, V before each completion token
    rollout_logprobs: list[float] | None = None  # what the rollout engine reported when sampling
    teacher_logprobs: list[float] | None = None  # on-policy distillation's teacher (algorithm.distillation)
    truncated: bool | None = None  # cut at the generation limit (vLLM's finish_reason "length"); None: unknown
    desirable: bool | None = None  # KTO: the row's label (True desirable, False undesirable); None: unlabelled
    kl_probe: bool = False  # KTO: a mismatched (prompt, completion) pair scored only for the KL estimate z0
    completion_mask: list[int] | None = None  # multi-turn: 1 on the model's tokens, 0 on the environment's
    # routing replay (MoE): the rollout's experts per token of prompt + completion, [tokens(-1), layers, topk]
    routed_experts: torch.Tensor | None = None
    # vision-language models: the prompt's pictures as the model's pixel values ([3, H, W] each), in the order of
    # their image tokens in prompt_ids; the samples of one prompt hold the same tensors
    images: tuple[torch.Tensor, ...] = ()
    # multi-turn: the pictures the environment answered with, in the order of their image tokens in completion_ids
    completion_images: tuple[torch.Tensor, ...] = ()


Metrics = dict[str, float]


@runtime_checkable
class Algorithm(Protocol):
    """One RL algorithm: batch preparation (no gradients) and the per-micro-batch loss."""

    @property
    def name(self) -> str: ...

    @property
    def needs_reference(self) -> bool:
        """The driver must fill `Sample.ref_logprobs` before `prepare`."""
        ...

    @property
    def needs_old_logprobs(self) -> bool:
        """The driver should fill `Sample.old_logprobs` (GRPO without them: ratio 1, on-policy)."""
        ...

    @property
    def needs_values(self) -> bool:
        """The driver must fill `Sample.values` (PPO with a critic)."""
        ...

    def prepare(self, samples: Sequence[Sample], token_budget: int) -> PackedBatch:
        """Pack the samples and attach advantages and the other fields the loss reads."""
        ...

    def loss(self, logprobs: torch.Tensor, batch: PackedBatch) -> tuple[torch.Tensor, Metrics]:
        """Scalar loss (to minimise) and float metrics from the current policy's `[R, L]` log-probs."""
        ...


def pack_samples(
    samples: Sequence[Sample], token_budget: int, *, pad_id: int = 0, pad_to_multiple: int = 1,
    share_prompts: bool = False,
) -> PackedBatch:
    """Pack samples as GRPO and PPO do (one sample per unit; DPO packs pairs itself). With
    `share_prompts` the samples of one prompt (a group) form a unit that holds the prompt once."""
    batch = pack([s.prompt_ids for s in samples], [s.completion_ids for s in samples], token_budget,
                 units=prompt_groups(samples) if share_prompts else None, pad_id=pad_id,
                 pad_to_multiple=pad_to_multiple, share_prompts=share_prompts,
                 completion_masks=[s.completion_mask for s in samples],
                 routings=[s.routed_experts for s in samples])
    batch.images = pictures.by_row(batch.placements, [s.images for s in samples], batch.num_rows,
                                   [s.completion_images for s in samples])
    return batch


def prompt_groups(samples: Sequence[Sample]) -> list[list[int]]:
    """Indices of the samples with identical prompt tokens, in order of first appearance."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, s in enumerate(samples):  # (pictures: two prompts with the same ids but other pictures differ)
        groups.setdefault((*s.prompt_ids, -1, *map(id, s.images)), []).append(i)
    return list(groups.values())


def row_budget(samples: Sequence[Sample], *, share_prompts: bool = False, hidden: int | None = None) -> int:
    """Tokens per packed row: the longest sample rounded up to 64 (at least 64). With `share_prompts`,
    the row may grow to hold the longest group with its prompt once, up to `hidden // 2` tokens (the
    model's hidden size; SHARED_ROW_CAP when unknown or larger): every row's attention is dense
    (len x len under the mask), which costs about len / (6 hidden) of a token's other work, so a
    longer row would spend on attention what sharing saves; a longer group is split over rows."""
    longest = max((len(s.prompt_ids) + len(s.completion_ids) for s in samples), default=1)
    if share_prompts:
        cap = SHARED_ROW_CAP if hidden is None else min(SHARED_ROW_CAP, hidden // 2)
        longest = max(longest, shared_row_budget([s.prompt_ids for s in samples],
                                                 [s.completion_ids for s in samples], prompt_groups(samples),
                                                 cap=cap))
    return max(64, -(-longest // 64) * 64)


def per_token(samples: Sequence[Sample], attr: str) -> list[list[float]] | None:
    """The per-token list `attr` of every sample, or None when no sample has it.

    Raises `AlgorithmError` when only some samples have it or a length does not match.
    """
    values = [getattr(s, attr) for s in samples]
    if all(v is None for v in values):
        return None
    out: list[list[float]] = []
    for i, (s, v) in enumerate(zip(samples, values, strict=True)):
        if v is None or len(v) != len(s.completion_ids):
            raise AlgorithmError(f"sample {i}: {attr} must have one value per completion token")
        out.append(list(v))
    return out


def model_tokens(samples: Sequence[Sample]) -> list[list[float]]:
    """Per completion token, 1.0 where the model chose it and 0.0 on an environment's (multi-turn:
    `Sample.completion_mask`); all ones for a single reply."""
    return [[float(x) for x in s.completion_mask] if s.completion_mask is not None else [1.0] * len(s.completion_ids)
            for s in samples]


def last_model_token(model: Sequence[float]) -> int:
    """The index of the last token the model chose (where an outcome reward lands), or the last token."""
    return max((j for j, m in enumerate(model) if m > 0), default=len(model) - 1)
