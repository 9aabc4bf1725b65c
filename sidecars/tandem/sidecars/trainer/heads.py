"""What the losses see of a forward pass: token log-probs (policy, reference) or values (critic).

Role: both take this rank's output `logits [rows, len, V/tp]` of a packed micro-batch and return a
`[rows, len]` tensor in the log-prob layout: entry t is about token t of its sample given the
tokens before it, 0 at each sample's first token and in padding (`out[:, 1:]` is the algorithms'
labels layout without its last column; `shift_to_labels` converts). Callers: `MegatronEngine._outputs`
(forwards and train steps); `TrainerContext` and `sharded` (`shift_to_labels`).
"""

from __future__ import annotations

from typing import Any

import torch

from tandem.checkpoint_engine.convert import ModelShape
from tandem.sidecars.trainer import micro_batches
from tandem.sidecars.trainer.megatron_build import Parallelism


def _aligned(per_position: torch.Tensor, mb: Any) -> torch.Tensor:
    """`per_position[:, t-1]` (computed at token t-1, about token t) placed at t within each sample."""
    seg = micro_batches.require(mb, "segment_ids")
    same = (seg[:, 1:] == seg[:, :-1]) & (seg[:, 1:] != 0)
    scored = torch.where(same, per_position, torch.zeros_like(per_position))
    return torch.cat([torch.zeros_like(scored[:, :1]), scored], dim=1)


def logprobs(logits: torch.Tensor, mb: Any, shape: ModelShape, par: Parallelism) -> torch.Tensor:
    """Token log-probs from this rank's vocab shard (vocab-parallel cross entropy, padding masked)."""
    from megatron.core import tensor_parallel as mtp

    logits = logits.float()
    if shape.megatron_vocab != shape.vocab:  # padded rows never win the softmax
        start = par.tp_rank * logits.shape[-1]
        column = torch.arange(start, start + logits.shape[-1], device=logits.device)
        logits = logits.masked_fill(column >= shape.vocab, torch.finfo(logits.dtype).min)
    ids = micro_batches.require(mb, "input_ids")
    nll = mtp.vocab_parallel_cross_entropy(logits[:, :-1].contiguous(), ids[:, 1:].contiguous())
    return _aligned(-nll, mb)


def values(logits: torch.Tensor, mb: Any, par: Parallelism) -> torch.Tensor:
    """Critic values: entry t is V(the prefix before token t), the state token t was sampled in.

    The value head is column 0 of the critic's untied output layer, held by tensor-parallel rank
    0; an all-reduce of it (rank 0's column, zeros elsewhere) gives every rank the values, and its
    backward hands every rank the same gradient, of which only rank 0's column keeps any.
    """
    from megatron.core import tensor_parallel as mtp

    v = logits[..., 0].float()
    if par.tp > 1:
        v = mtp.reduce_from_tensor_model_parallel_region(v * (1.0 if par.tp_rank == 0 else 0.0))
    return _aligned(v[:, :-1], mb)


def shift_to_labels(out: torch.Tensor) -> torch.Tensor:
    """Engine layout (position t scores token t) → algorithm layout (position t scores token t+1)."""
    return torch.cat([out[:, 1:], torch.zeros_like(out[:, :1])], dim=1)
