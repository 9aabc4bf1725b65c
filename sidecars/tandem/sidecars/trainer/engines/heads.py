"""What the losses see of a forward pass: token log-probs (policy, reference) or values (critic).

Role: both take this rank's output `logits [rows, len, V/tp]` of a packed micro-batch and return a
`[rows, len]` tensor in the log-prob layout: entry t is about token t of its sample given the
tokens before it, 0 at each sample's first token and in padding (`out[:, 1:]` is the algorithms'
labels layout without its last column; `shift_to_labels` converts). Callers: `MegatronEngine._outputs`
(forwards and train steps); the Train phase (`loop.phases.train`) and `loop.forwards.sharded` (`shift_to_labels`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from tandem.checkpoint_engine.convert import ModelShape
from tandem.sidecars.trainer.engines import micro_batches
from tandem.sidecars.trainer.engines.common import Parallelism


def aligned(per_position: torch.Tensor, mb: Any) -> torch.Tensor:
    """`per_position[:, t-1]` (computed at token t-1, about token t) placed at t within each sample."""
    seg = micro_batches.require(mb, "segment_ids")
    same = (seg[:, 1:] == seg[:, :-1]) & (seg[:, 1:] != 0)
    scored = torch.where(same, per_position, torch.zeros_like(per_position))
    return torch.cat([torch.zeros_like(scored[:, :1]), scored], dim=1)


def logprobs(logits: torch.Tensor, mb: Any, shape: ModelShape, par: Parallelism) -> torch.Tensor:
    """Token log-probs from this rank's vocab shard (vocab-parallel cross entropy, padding masked)."""
    from megatron.core import tensor_parallel as mtp

    logits = _mask_padded_vocab(logits.float(), shape, par)
    ids = micro_batches.require(mb, "input_ids")
    nll = mtp.vocab_parallel_cross_entropy(logits[:, :-1].contiguous(), ids[:, 1:].contiguous())
    return aligned(-nll, mb)


def scored_positions(mb: Any) -> torch.Tensor | None:
    """Flat indices, in the decoder's `[len, rows]` order, of the positions whose next token the
    loss scores (`loss_mask` > 0, labels layout); None when the micro-batch has no `loss_mask`."""
    mask = micro_batches.field(mb, "loss_mask")
    if mask is None:
        return None
    return torch.nonzero(mask.t().reshape(-1) > 0).squeeze(1)


@contextmanager
def only_scored(decoder: torch.nn.Module, index: torch.Tensor | None, sequence_parallel: bool = False
                ) -> Iterator[None]:
    """While active, the decoder's output `[len, rows, hidden]` is cut to the scored positions
    `[n, 1, hidden]`, so the output layer and the softmax run on the tokens the loss reads only
    (in RL, the completions: most of a packed row is prompt or padding). Gradients flow through
    the selection. Used by `MegatronEngine.train_step` on the last pipeline stage. Under
    `sequence_parallel` each TP rank holds `[len/tp, rows, hidden]`: the parts are gathered first, and
    the backward keeps this rank's part of a gradient every TP rank holds whole (the chunked head's
    `copy_to_tensor_model_parallel_region` sums the ranks' partial gradients before it)."""
    if index is None:
        yield
        return

    def cut(_module: torch.nn.Module, _args: Any, hidden: torch.Tensor) -> torch.Tensor:
        if sequence_parallel:
            from megatron.core import tensor_parallel as mtp

            hidden = mtp.gather_from_sequence_parallel_region(hidden, tensor_parallel_output_grad=False)
        return hidden.reshape(-1, hidden.shape[-1]).index_select(0, index.to(hidden.device)).unsqueeze(1)

    handle = decoder.register_forward_hook(cut)
    try:
        yield
    finally:
        handle.remove()


def scored_logprobs(logits: torch.Tensor, mb: Any, shape: ModelShape, par: Parallelism) -> torch.Tensor:
    """`logprobs` for logits of the scored positions only (`[1, n, V/tp]` from `only_scored`):
    the same `[rows, len]` layout, with the log-probs of the scored tokens and 0 elsewhere."""
    from megatron.core import tensor_parallel as mtp

    index, target = _scored_targets(mb)
    logits = _mask_padded_vocab(logits.float(), shape, par)
    nll = mtp.vocab_parallel_cross_entropy(logits.contiguous(), target.to(logits.device).unsqueeze(0).contiguous())
    return _place(-nll.reshape(-1), index, mb)


@contextmanager
def hidden_out(output_layer: torch.nn.Module) -> Iterator[list[torch.Tensor]]:
    """While active, the model's output layer hands back its input (the last hidden states) instead
    of logits; the yielded list receives the weight it would have used (the embedding when tied),
    for `scored_logprobs_from_hidden`. Used by `MegatronEngine` on the last pipeline stage."""
    weights: list[torch.Tensor] = []
    own = output_layer.weight if hasattr(output_layer, "weight") else None

    def passthrough(input_: torch.Tensor, weight: torch.Tensor | None = None, **_: Any) -> tuple[torch.Tensor, None]:
        chosen = weight if weight is not None else own
        if chosen is None:
            raise ValueError("the output layer has no weight to score with")
        weights.append(chosen)
        return input_, None

    output_layer.forward = passthrough  # type: ignore[method-assign]
    try:
        yield weights
    finally:
        del output_layer.forward


def scored_logprobs_from_hidden(hidden: torch.Tensor, weight: torch.Tensor, mb: Any, shape: ModelShape,
                                par: Parallelism) -> torch.Tensor:
    """`scored_logprobs` from the last hidden states of the scored positions (`[1, n, hidden]`, from
    `only_scored` and `hidden_out`) and the output weight: the output layer and the log-softmax run a
    chunk of positions at a time (`chunked_logprobs`), so no `[n, vocab]` tensor is ever whole."""
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel as mtp

    from tandem.sidecars.trainer.engines.chunked_logprobs import chunked_logprobs

    index, target = _scored_targets(mb)
    flat = hidden.reshape(-1, hidden.shape[-1])
    group = None
    if par.tp > 1:
        flat = mtp.copy_to_tensor_model_parallel_region(flat)  # its backward sums the ranks' gradients
        group = ps.get_tensor_model_parallel_group()
    start = par.tp_rank * weight.shape[0]
    valid = max(0, min(weight.shape[0], shape.vocab - start))
    lp = chunked_logprobs(flat, weight, target.to(flat.device), vocab_start=start, valid=valid, group=group)
    return _place(lp, index, mb)


def _scored_targets(mb: Any) -> tuple[torch.Tensor, torch.Tensor]:
    index = scored_positions(mb)
    if index is None:
        raise ValueError("scored log-probs need a micro-batch with loss_mask")
    labels = micro_batches.require(mb, "labels")
    return index, labels.t().reshape(-1).index_select(0, index.to(labels.device))


def _place(scored: torch.Tensor, index: torch.Tensor, mb: Any) -> torch.Tensor:
    """Values of the scored positions (decoder order) → `[rows, len]` in the log-prob layout."""
    rows, length = micro_batches.require(mb, "labels").shape
    flat = torch.zeros(rows * length, dtype=scored.dtype, device=scored.device)
    flat = flat.index_copy(0, index.to(scored.device), scored)
    per_label = flat.reshape(length, rows).t()  # labels layout: position t scores token t+1
    return torch.cat([torch.zeros_like(per_label[:, :1]), per_label[:, :-1]], dim=1)


def _mask_padded_vocab(logits: torch.Tensor, shape: ModelShape, par: Parallelism) -> torch.Tensor:
    """Padded vocabulary rows (TP padding) never win the softmax."""
    if shape.megatron_vocab == shape.vocab:
        return logits
    start = par.tp_rank * logits.shape[-1]
    column = torch.arange(start, start + logits.shape[-1], device=logits.device)
    return logits.masked_fill(column >= shape.vocab, torch.finfo(logits.dtype).min)


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
    return aligned(v[:, :-1], mb)


def shift_to_labels(out: torch.Tensor) -> torch.Tensor:
    """Engine layout (position t scores token t) → algorithm layout (position t scores token t+1)."""
    return torch.cat([out[:, 1:], torch.zeros_like(out[:, :1])], dim=1)
