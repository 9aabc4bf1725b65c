"""Sequence packing for the trainer: several variable-length samples per row, kept apart.

Used by :class:`~tandem.sidecars.trainer.megatron_engine.MegatronEngine` (attention masks,
positions, micro-batches) and by the RL driver to pack rollouts before ``token_logprobs`` and
``train_step``. A packed batch is a mapping of ``[rows, row_len]`` tensors:

* ``input_ids``  (long) token ids, 0 in padding;
* ``segment_ids`` (long) 1, 2, ... for the samples of a row, 0 for padding;
* any per-token extras the caller adds (loss masks, advantages, old log-probs, ...), which
  ``pack_sequences`` lays out the same way when passed as ``extras``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import torch

Batch = Mapping[str, torch.Tensor]


class PackingError(ValueError):
    """A sample does not fit a row, or a batch lacks a field."""


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where sample ``i`` of the input went: ``row``, ``start`` column, ``length``."""

    row: int
    start: int
    length: int


def pack_sequences(
    sequences: Sequence[Sequence[int]],
    row_len: int,
    extras: Mapping[str, Sequence[Sequence[float]]] | None = None,
    min_rows: int = 1,
    row_multiple: int = 1,
) -> tuple[dict[str, torch.Tensor], list[Placement]]:
    """First-fit-decreasing packing of token sequences into rows of ``row_len`` tokens.

    ``extras[k][i]`` holds one float per token of sample ``i``; it becomes a float32 field ``k``.
    The number of rows is at least ``min_rows`` and a multiple of ``row_multiple`` (empty rows
    are padding), so that rows divide evenly into micro-batches.
    """
    free: list[int] = []
    placements: list[Placement | None] = [None] * len(sequences)
    for i in sorted(range(len(sequences)), key=lambda j: -len(sequences[j])):
        n = len(sequences[i])
        if n == 0 or n > row_len:
            raise PackingError(f"sample {i} has {n} tokens; rows hold 1..{row_len}")
        row = next((r for r, used in enumerate(free) if used + n <= row_len), len(free))
        if row == len(free):
            free.append(0)
        placements[i] = Placement(row, free[row], n)
        free[row] += n
    rows = max(len(free), min_rows)
    rows = -(-rows // row_multiple) * row_multiple
    batch = {
        "input_ids": torch.zeros(rows, row_len, dtype=torch.long),
        "segment_ids": torch.zeros(rows, row_len, dtype=torch.long),
    }
    for key in extras or {}:
        batch[key] = torch.zeros(rows, row_len, dtype=torch.float32)
    seg_count = [0] * rows
    done = [p for p in placements if p is not None]
    for i, p in enumerate(done):
        seg_count[p.row] += 1
        span = slice(p.start, p.start + p.length)
        batch["input_ids"][p.row, span] = torch.as_tensor(list(sequences[i]), dtype=torch.long)
        batch["segment_ids"][p.row, span] = seg_count[p.row]
        for key, values in (extras or {}).items():
            if len(values[i]) != p.length:
                raise PackingError(f"extras[{key!r}][{i}] has {len(values[i])} values for {p.length} tokens")
            batch[key][p.row, span] = torch.as_tensor(list(values[i]), dtype=torch.float32)
    return batch, done


def unpack(values: torch.Tensor, placements: Sequence[Placement]) -> list[torch.Tensor]:
    """Per-sample slices of a ``[rows, row_len]`` tensor (e.g. ``token_logprobs``'s result)."""
    return [values[p.row, p.start : p.start + p.length] for p in placements]


def position_ids(segment_ids: torch.Tensor) -> torch.Tensor:
    """Positions restarting at 0 at the start of each sample (and of each padding run)."""
    rows, cols = segment_ids.shape
    index = torch.arange(cols, device=segment_ids.device).expand(rows, cols)
    starts = torch.ones_like(segment_ids, dtype=torch.bool)
    starts[:, 1:] = segment_ids[:, 1:] != segment_ids[:, :-1]
    start_index = torch.where(starts, index, torch.zeros_like(index)).cummax(dim=1).values
    return index - start_index


def attention_mask(segment_ids: torch.Tensor) -> torch.Tensor:
    """Megatron's boolean mask ``[rows, 1, len, len]``: True where attention is NOT allowed.

    A token sees the earlier tokens of its own sample only (causal, block-diagonal).
    """
    cols = segment_ids.shape[1]
    causal = torch.ones(cols, cols, dtype=torch.bool, device=segment_ids.device).tril()
    same = segment_ids[:, :, None] == segment_ids[:, None, :]
    return ~(same & causal)[:, None]


def split_micro_batches(batch: Batch, micro_batch_size: int) -> list[dict[str, torch.Tensor]]:
    """Split every ``[rows, ...]`` field of ``batch`` into consecutive groups of rows."""
    for key in ("input_ids", "segment_ids"):
        if key not in batch:
            raise PackingError(f"batch lacks {key!r}")
    rows = batch["input_ids"].shape[0]
    if micro_batch_size < 1:
        raise PackingError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
    out: list[dict[str, torch.Tensor]] = []
    for start in range(0, rows, micro_batch_size):
        out.append({k: v[start : start + micro_batch_size] for k, v in batch.items()})
    return out
