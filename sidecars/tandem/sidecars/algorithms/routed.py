"""Routing replay's per-sample check: the rollout's routed experts of each sample fit its tokens; their size.

Role: `check_routings` validates `pack(..., routings=...)`'s input before anything is packed (see
`algorithms.packing`, "Routing replay"). Callers: `packing.pack`; the driver before it builds samples.
A sample's routing is `[n, layers, topk]` (uint8 or int16), row p the experts of token p of prompt +
completion; n is tokens - 1 (vLLM runs no forward on the last sampled token) or tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class RoutingError(ValueError):
    """A sample's routed experts do not fit its tokens or the other samples' (the sample and shapes named)."""


def check_routings(routings: Sequence[torch.Tensor | None] | None, prompts: Sequence[Sequence[int]],
                   completions: Sequence[Sequence[int]]) -> list[torch.Tensor] | None:
    """The samples' routings when any sample has one, else None; `RoutingError` when one is missing,
    covers too few or too many tokens, or has another layers x topk than sample 0's."""
    if routings is None or all(r is None for r in routings):
        return None
    if len(routings) != len(prompts):
        raise RoutingError(f"routed_experts for {len(routings)} samples, {len(prompts)} packed")
    out: list[torch.Tensor] = []
    for i, r in enumerate(routings):
        if r is None:
            raise RoutingError(f"sample {i} has no routed_experts while others have: routing replay needs every "
                               "sample's routing")
        tokens = len(prompts[i]) + len(completions[i])
        if r.dim() != 3 or not tokens - 1 <= r.shape[0] <= tokens:
            raise RoutingError(f"sample {i}: routed_experts of shape {tuple(r.shape)} for {tokens} tokens "
                               f"(needs [{tokens - 1} or {tokens}, layers, topk])")
        if r.dtype not in (torch.uint8, torch.int16, torch.int32, torch.int64):
            raise RoutingError(f"sample {i}: routed_experts has dtype {r.dtype}; expert ids are integers")
        if out and r.shape[1:] != out[0].shape[1:]:
            raise RoutingError(f"sample {i}: routed_experts has {tuple(r.shape[1:])} layers x topk, sample 0 "
                               f"{tuple(out[0].shape[1:])}")
        out.append(r)
    return out


def bytes_per_sample(routings: Sequence[torch.Tensor | None]) -> float:
    """Mean bytes of routing a sample carries (the cost of replay on the wire and in memory); 0 for none.
    Caller: bench/moe_replay.py."""
    sizes = [int(r.numel()) * int(r.element_size()) for r in routings if r is not None]
    return sum(sizes) / max(len(sizes), 1)
