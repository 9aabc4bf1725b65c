"""Tensor-parallel shard layouts: Megatron's (merge/split) and a vLLM rollout's (rollout_slice).

Used by the trainer's export (merge the TP shards it all-gathered, slice for the rollout's TP) and
its loader (split full tensors into this rank's shard). Megatron rules, by parameter name:

* row-parallel weights (``linear_proj``, ``linear_fc2``) are split along dim 1;
* ``linear_fc1`` shards are each ``[gate_r; up_r]``: split gate and up separately;
* norms, the router and row-parallel biases are replicated;
* everything else (``linear_qkv`` in whole query groups, embeddings, output layer) along dim 0.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tandem.checkpoint_engine.convert.dense import COLUMN, KEY_VALUE, QUERY, REPLICATED, ROW, VOCAB
from tandem.checkpoint_engine.convert.shape import ConversionError, ModelShape

VLLM_VOCAB_PADDING = 64  # vLLM's DEFAULT_VOCAB_PADDING_SIZE for VocabParallelEmbedding


def megatron_split_kind(name: str) -> str:
    if name.endswith(("layernorm.weight", "layer_norm_weight", "router.weight")):
        return REPLICATED
    if name.endswith(("linear_proj.bias", "linear_fc2.bias")):
        return REPLICATED
    if name.endswith(("linear_proj.weight", "linear_fc2.weight")):
        return ROW
    if "linear_fc1." in name:
        return "gate_up"
    return COLUMN


def merge_tp(name: str, shards: Sequence[torch.Tensor]) -> torch.Tensor:
    """Full Megatron tensor from its TP shards (rank order)."""
    kind = megatron_split_kind(name)
    if len(shards) == 1 or kind == REPLICATED:
        return shards[0]
    if kind == ROW:
        return torch.cat(list(shards), dim=1)
    if kind == "gate_up":
        halves = [s.chunk(2, dim=0) for s in shards]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim=0)
    return torch.cat(list(shards), dim=0)


def split_tp(name: str, full: torch.Tensor, tp: int, rank: int) -> torch.Tensor:
    """This TP rank's shard of a full Megatron tensor (inverse of :func:`merge_tp`)."""
    kind = megatron_split_kind(name)
    if tp == 1 or kind == REPLICATED:
        return full
    if kind == ROW:
        return _chunk(full, tp, 1, name)[rank]
    if kind == "gate_up":
        gate, up = full.chunk(2, dim=0)
        return torch.cat([_chunk(gate, tp, 0, name)[rank], _chunk(up, tp, 0, name)[rank]], dim=0)
    return _chunk(full, tp, 0, name)[rank]


def _chunk(t: torch.Tensor, parts: int, dim: int, name: str) -> tuple[torch.Tensor, ...]:
    if t.shape[dim] % parts:
        raise ConversionError(f"{name}: dim {dim} of size {t.shape[dim]} does not split in {parts}")
    return tuple(t.chunk(parts, dim=dim))


def rollout_slice(
    kind: str, hf_name: str, full: torch.Tensor, shape: ModelShape, tp: int, rank: int
) -> torch.Tensor:
    """The part of a full HF tensor that vLLM rollout rank ``rank`` of ``tp`` holds.

    ``kind`` comes from the family's ``rollout_split``. Query heads split evenly; key/value heads
    split when there are at least ``tp`` of them, else each rank holds a copy of the head it
    shares (rank r holds head ``r * kv_heads // tp``); vocabulary rows follow vLLM's padded
    partition (``ceil(vocab / 64) * 64 / tp`` rows per rank, the padding left out).
    """
    if tp == 1 or kind == REPLICATED:
        return full
    if kind == ROW:
        return _chunk(full, tp, 1, hf_name)[rank]
    if kind in (COLUMN, QUERY):
        return _chunk(full, tp, 0, hf_name)[rank]
    if kind == KEY_VALUE:
        if shape.num_kv_heads >= tp:
            return _chunk(full, tp, 0, hf_name)[rank]
        if tp % shape.num_kv_heads:
            raise ConversionError(f"{hf_name}: tp={tp} is not a multiple of kv heads={shape.num_kv_heads}")
        head = rank * shape.num_kv_heads // tp
        return full[head * shape.head_dim : (head + 1) * shape.head_dim]
    if kind == VOCAB:
        padded = -(-shape.vocab // VLLM_VOCAB_PADDING) * VLLM_VOCAB_PADDING
        per_rank = padded // tp
        return full[rank * per_rank : min((rank + 1) * per_rank, shape.vocab)]
    raise ConversionError(f"{hf_name}: unknown rollout split {kind!r}")
