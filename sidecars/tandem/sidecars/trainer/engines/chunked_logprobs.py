"""Token log-probs straight from the last hidden states, a chunk of positions at a time.

Role: the output layer and the softmax over the vocabulary make the largest tensors of a forward:
positions x vocabulary floats, of which cross entropy and its backward hold several copies (196 KB
per position for SmolLM2's 49k vocabulary, 600 KB for Qwen's 152k). The trainer needs one number per
position, the log-prob of the token that follows, so `chunked_logprobs` computes the logits of a
chunk of positions, keeps their log-sum-exp and the target's logit, and drops the chunk; the
backward pass recomputes each chunk's logits from the saved hidden states and the weight. Memory
is O(chunk x vocabulary) instead of O(positions x vocabulary), for one more output-layer matmul in
the backward pass. The arithmetic is Megatron's vocab-parallel cross entropy: logits in the
model's dtype turned to float32, padded vocabulary columns masked out, and with tensor parallelism
the max, the sum of exponentials and the target's logit all-reduced over the tensor-parallel ranks
(each holds a slice of the vocabulary); the caller hands in the hidden states through
`copy_to_tensor_model_parallel_region`, whose backward sums the ranks' input gradients.
Caller: `heads.scored_logprobs_from_hidden` (train steps and inference forwards of the Megatron engine).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from tandem.spec.trainer import IMAGE_TOKEN_BIAS

CHUNK_ELEMENTS = 1 << 24  # logits per chunk (64 MiB in float32): positions per chunk = this // vocab slice


def chunk_positions(vocab_slice: int, elements: int = CHUNK_ELEMENTS) -> int:
    return max(16, elements // max(1, vocab_slice))


def _chunk_logits(hidden: torch.Tensor, weight: torch.Tensor, valid: int, pushed: tuple[int, ...] = ()
                  ) -> torch.Tensor:
    """Float32 logits of a chunk; columns at or past `valid` (padded vocabulary) never win; the `pushed` columns
    get IMAGE_TOKEN_BIAS, as the rollout's sampler adds it (a vision-language model's image token)."""
    logits = (hidden.to(weight.dtype) @ weight.t()).float()
    if valid < logits.shape[-1]:
        logits[:, valid:] = torch.finfo(logits.dtype).min
    if pushed:
        logits[:, list(pushed)] += IMAGE_TOKEN_BIAS
    return logits


def _all_reduce(tensor: torch.Tensor, op: Any, group: Any) -> torch.Tensor:
    if group is not None:
        dist.all_reduce(tensor, op=op, group=group)
    return tensor


class _ChunkedLogprobs(torch.autograd.Function):  # type: ignore[misc]
    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, vocab_start: int,
                valid: int, chunk: int, group: Any, pushed: tuple[int, ...]) -> torch.Tensor:
        n = hidden.shape[0]
        out = torch.empty(n, dtype=torch.float32, device=hidden.device)
        lse = torch.empty(n, dtype=torch.float32, device=hidden.device)
        local = target - vocab_start
        inside = (local >= 0) & (local < weight.shape[0])
        local = torch.where(inside, local, torch.zeros_like(local))
        with torch.no_grad():
            for lo in range(0, n, chunk):
                hi = min(n, lo + chunk)
                logits = _chunk_logits(hidden[lo:hi], weight, valid, pushed)
                top = _all_reduce(logits.max(dim=-1).values, dist.ReduceOp.MAX, group)
                summed = _all_reduce(torch.exp(logits - top.unsqueeze(1)).sum(dim=-1), dist.ReduceOp.SUM, group)
                picked = logits.gather(1, local[lo:hi].unsqueeze(1)).squeeze(1)
                picked = _all_reduce(torch.where(inside[lo:hi], picked, torch.zeros_like(picked)),
                                     dist.ReduceOp.SUM, group)
                lse[lo:hi] = top + summed.log()
                out[lo:hi] = picked - lse[lo:hi]
                del logits
        ctx.save_for_backward(hidden, weight, local, inside, lse)
        ctx.valid, ctx.chunk, ctx.pushed = valid, chunk, pushed
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        hidden, weight, local, inside, lse = ctx.saved_tensors
        grad_hidden = torch.empty(hidden.shape, dtype=weight.dtype, device=hidden.device)
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        n = hidden.shape[0]
        for lo in range(0, n, ctx.chunk):
            hi = min(n, lo + ctx.chunk)
            h = hidden[lo:hi].to(weight.dtype)
            logits = _chunk_logits(h, weight, ctx.valid, ctx.pushed)
            # d log p(target) / d logits = onehot(target) - softmax; times the incoming gradient
            g = torch.exp_(logits.sub_(lse[lo:hi].unsqueeze(1))).mul_(-grad[lo:hi].float().unsqueeze(1))
            rows = torch.nonzero(inside[lo:hi]).squeeze(1)
            g[rows, local[lo:hi][rows]] += grad[lo:hi][rows].float()
            g_model = g.to(weight.dtype)
            del logits
            grad_hidden[lo:hi] = g_model @ weight
            grad_weight.addmm_(g_model.t().float(), h.float())
        return grad_hidden.to(hidden.dtype), grad_weight.to(weight.dtype), None, None, None, None, None, None


def chunked_logprobs(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, *, vocab_start: int = 0,
                     valid: int | None = None, group: Any = None, chunk: int | None = None,
                     pushed: tuple[int, ...] = ()) -> torch.Tensor:
    """log p(target[i] | position i) for hidden states `[n, hidden]` and this rank's vocabulary slice
    `weight [V_slice, hidden]` (ids `vocab_start ..`; the first `valid` columns are real vocabulary,
    the rest padding). `group`: the tensor-parallel process group when the vocabulary is split over
    several ranks, else None. `pushed`: columns of this slice whose logits get IMAGE_TOKEN_BIAS (as the
    rollout samples a vision-language model). Differentiable in `hidden` and `weight`; float32 result `[n]`."""
    slice_size = weight.shape[0]
    return _ChunkedLogprobs.apply(hidden, weight, target, vocab_start,
                                  slice_size if valid is None else valid,
                                  chunk or chunk_positions(slice_size), group, pushed)  # type: ignore[no-any-return]
