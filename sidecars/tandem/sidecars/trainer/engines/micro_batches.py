"""Packed-batch plumbing for the Megatron engine: masks, positions, micro-batches, devices.

Used by :class:`~tandem.sidecars.trainer.engines.megatron_engine.MegatronEngine`. A batch is either the
algorithms' ``PackedBatch`` (:mod:`tandem.sidecars.algorithms.packing`, the RL loop's type) or a
plain mapping of ``[rows, row_len]`` tensors; both carry ``input_ids`` and ``segment_ids``
(1, 2, ... for the samples of a row, 0 for padding) and optionally ``position_ids`` and
``prefix_ids`` (a group's shared prompt, see the packing module). Attention never crosses a
segment boundary, except from a sample to its shared prompt.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch

from tandem.sidecars.algorithms.packing import allowed_attention


class BatchError(ValueError):
    """A batch lacks a field or cannot be split as asked."""


def field(batch: Any, name: str) -> torch.Tensor | None:
    """``batch[name]`` for a mapping, ``batch.name`` for an object; None when absent."""
    if isinstance(batch, Mapping):
        return batch.get(name)
    value = getattr(batch, name, None)
    return value if isinstance(value, torch.Tensor) else None


def require(batch: Any, name: str) -> torch.Tensor:
    value = field(batch, name)
    if value is None:
        raise BatchError(f"batch lacks {name!r}")
    return value


def position_ids(segment_ids: torch.Tensor) -> torch.Tensor:
    """Positions restarting at 0 at the start of each sample (and of each padding run)."""
    rows, cols = segment_ids.shape
    index = torch.arange(cols, device=segment_ids.device).expand(rows, cols)
    starts = torch.ones_like(segment_ids, dtype=torch.bool)
    starts[:, 1:] = segment_ids[:, 1:] != segment_ids[:, :-1]
    start_index = torch.where(starts, index, torch.zeros_like(index)).cummax(dim=1).values
    return index - start_index


def attention_mask(segment_ids: torch.Tensor, prefix_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Megatron's boolean mask ``[rows, 1, len, len]``: True where attention is NOT allowed.

    A token sees the earlier tokens of its own sample, and of the shared-prompt segment that
    ``prefix_ids`` names for it (``packing.allowed_attention``); padding sees itself.
    """
    return ~allowed_attention(segment_ids, prefix_ids)


DENSE_MAX_TOKENS = 512  # rows up to this length take the dense mask (one batched matmul beats many calls)


def segment_layout(segment_ids: torch.Tensor, prefix_ids: torch.Tensor | None) -> torch.Tensor:
    """The compact layout `segment_attention.SegmentAttention` reads instead of a mask: `[rows, 2, len]`
    int64, the segment ids then the prefix ids (0: no shared prompt)."""
    prefix = torch.zeros_like(segment_ids) if prefix_ids is None else prefix_ids
    return torch.stack([segment_ids, prefix.to(segment_ids.dtype)], dim=1).to(torch.int64)


def attention_input(segment_ids: torch.Tensor, prefix_ids: torch.Tensor | None,
                    dense_max: int = DENSE_MAX_TOKENS) -> torch.Tensor:
    """What the model's attention gets: the dense mask (`attention_mask`) for rows of at most `dense_max`
    tokens, the compact layout for longer ones (memory linear in the row, not quadratic)."""
    if segment_ids.shape[1] <= dense_max:
        return attention_mask(segment_ids, prefix_ids)
    return segment_layout(segment_ids, prefix_ids)


@contextmanager
def rope_at(gpt: Any, positions: torch.Tensor | None) -> Iterator[None]:
    """While active, the model's rotary embedding rotates token t of row r by ``positions[r, t]``.

    Megatron's RoPE rotates by the index in the row and ignores ``position_ids``; packing samples one
    after another is still exact because attention only sees differences of positions within a
    sample. A shared prompt breaks that (the second sample of a group sits further from the prefix
    than its position says), so batches with ``prefix_ids`` pass their ``position_ids`` through here:
    rows of the model's own table (scaling included), ``[len, rows, 1, dim]``, broadcast over heads.
    ``None`` leaves the model as it is.
    """
    rotary = getattr(gpt, "rotary_pos_emb", None)
    if positions is None:
        yield
        return
    if rotary is None or getattr(gpt, "position_embedding_type", "rope") != "rope":
        raise BatchError("shared prompts need a model with rotary position embeddings (rope)")
    length = int(positions.shape[1])
    table = rotary(length)  # [len, 1, 1, dim]: positions 0..len-1 (a position never exceeds its index)
    emb = table[:, 0, 0, :][positions.t().to(table.device)].unsqueeze(2)

    def forward(*_args: Any, **_kwargs: Any) -> torch.Tensor:
        return emb

    rotary.forward = forward
    try:
        yield
    finally:
        del rotary.forward


def pad_columns(tensors: tuple[torch.Tensor | None, ...], length: int) -> tuple[Any, ...]:
    """Each ``[rows, len]`` tensor padded with zeros to ``length`` columns (segment 0: padding,
    which sees only itself); None stays None."""
    return tuple(None if t is None else torch.nn.functional.pad(t, (0, length - t.shape[1])) for t in tensors)


def split_rows(batch: Any, micro_batch_size: int) -> list[Any]:
    """Consecutive groups of ``micro_batch_size`` rows, in the batch's own type.

    Objects with a ``rows(lo, hi)`` method (``PackedBatch``) split themselves; mappings are
    sliced field by field.
    """
    if micro_batch_size < 1:
        raise BatchError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
    rows = require(batch, "input_ids").shape[0]
    require(batch, "segment_ids")
    bounds = [(lo, min(lo + micro_batch_size, rows)) for lo in range(0, rows, micro_batch_size)]
    return [take_rows(batch, lo, hi) for lo, hi in bounds]


def rows_per_micro_batch(rows: int, row_len: int, micro_batch_size: int, max_tokens: int | None,
                         equal: bool = False) -> int:
    """Rows per micro-batch: ``micro_batch_size``, fewer when ``max_tokens`` (``trainer.microBatchTokens``)
    caps rows x row length, never fewer than one. ``equal`` (pipeline parallelism, whose schedules
    need micro-batches of one size): the largest count within the cap that divides ``rows``, unless
    the cap does not bind."""
    size = micro_batch_size
    if max_tokens is not None:
        size = max(1, min(size, max_tokens // max(1, row_len)))
    if equal and size < micro_batch_size and rows % size:
        size = max(d for d in range(1, size + 1) if rows % d == 0)
    return size


def take_rows(batch: Any, lo: int, hi: int) -> Any:
    """Rows ``lo:hi`` in the batch's own type (``PackedBatch.rows`` or a field-by-field slice)."""
    if hasattr(batch, "rows") and not isinstance(batch, Mapping):
        return batch.rows(lo, hi)
    return {k: v[lo:hi] for k, v in batch.items()}


def train_share(batch: Any, dp: int, dp_rank: int, split: Any) -> tuple[list[Any], int, int]:
    """A train step's micro-batches on data-parallel rank `dp_rank`: `split` of its rows of the global `batch`
    (`dp_share`), how many of them count, and how many rows it took. A rank left without rows runs one row
    with weight 0 (counted 0): the gradient reduction is collective, so every rank takes part in the step."""
    rows = require(batch, "input_ids").shape[0]
    lo, hi = dp_share(rows, dp, dp_rank)
    mbs: list[Any] = split(take_rows(batch, lo, max(hi, lo + 1)))
    return mbs, (len(mbs) if hi > lo else 0), hi - lo


def dp_share(rows: int, dp: int, dp_rank: int) -> tuple[int, int]:
    """The contiguous rows ``[lo, hi)`` of a global batch that data-parallel rank ``dp_rank`` trains on.

    Shares differ by at most one row; a rank gets none when there are fewer rows than ranks.
    """
    if not 0 <= dp_rank < dp:
        raise BatchError(f"data-parallel rank {dp_rank} outside 0..{dp - 1}")
    return rows * dp_rank // dp, rows * (dp_rank + 1) // dp


def to_device(batch: Any, device: torch.device) -> Any:
    """The batch with its tensors (also inside dict fields) on ``device``; same type."""
    if device.type == "cpu":
        return batch

    def move(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return value.to(device)
        if isinstance(value, dict):
            return {k: move(v) for k, v in value.items()}
        return value

    if isinstance(batch, Mapping):
        return {k: move(v) for k, v in batch.items()}
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        changes = {f.name: move(getattr(batch, f.name)) for f in dataclasses.fields(batch)}
        return dataclasses.replace(batch, **changes)
    raise BatchError(f"cannot move a {type(batch).__name__} to {device}")
