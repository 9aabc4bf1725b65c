"""Routing replay (R3) in the Megatron forward: every MoE layer routes each token to the experts the
rollout engine routed it to, instead of choosing its own top-k.

Callers: :class:`~.megatron_engine.MegatronEngine` (``_forward_step`` before each micro-batch's forward,
``_run`` after each schedule), for every pass that takes a batch with ``routed_experts``: the old-log-prob,
reference and train passes alike (the reference model is a MoE of the same family: without replay its
log-probs, and so the KL term, would compare the two models under two different routings).

Mechanism: megatron-core's own ``router_replay`` (``TransformerConfig.moe_enable_routing_replay`` gives
each ``TopKRouter`` a ``RouterReplay``; with action ``REPLAY_FORWARD`` its top-k returns the target
indices and gathers their scores, so the gate weights, and their gradient into the router, come from the
router's current logits over the replayed experts). The targets are set per router here, not through
``RouterReplay``'s class-wide list: a process may hold a policy and a reference engine, whose routers
that list mixes.

Layout: ``routed_experts`` is ``[rows, cols, layers, topk]`` (uint8/int16) aligned with ``input_ids``
(see ``algorithms.packing``); Megatron's hidden states are ``[cols, rows, hidden]`` and its router sees
them flattened sequence-major, each TP rank its own contiguous part of the sequence under sequence
parallelism (MoE with TP), so each rank's target is ``routed.transpose(0, 1)`` cut to its part.
Expert parallelism does not change this (the allgather dispatcher routes before dispatch).
Activation recompute re-runs the forward in the backward with the targets still set, which holds for
one pipeline stage (each micro-batch's backward follows its forward); with pipeline parallelism the
engine refuses the combination.
"""

from __future__ import annotations

from typing import Any

import torch

from tandem.sidecars.trainer.engines.common import EngineError


def routers(gpt: Any, layer_numbers: dict[int, int]) -> list[tuple[int, Any]]:
    """(global layer number, its router) for this pipeline stage's MoE layers that can replay."""
    found: list[tuple[int, Any]] = []
    for local, layer in enumerate(gpt.decoder.layers):
        router = getattr(getattr(layer, "mlp", None), "router", None)
        if router is not None and getattr(router, "router_replay", None) is not None:
            found.append((layer_numbers[local], router))
    return found


def targets(routed: torch.Tensor, length: int, tp: int, tp_rank: int, sequence_parallel: bool) -> torch.Tensor:
    """This rank's router targets ``[tokens, layers, topk]`` (int64, the router's token order) for a
    micro-batch's ``routed`` ``[rows, cols, layers, topk]`` run at sequence ``length`` (>= cols: the
    padding columns sequence parallelism adds route to experts 0..topk-1, which padding never reads)."""
    rows, cols, layers, topk = routed.shape
    full = routed.to(torch.int64)
    if length > cols:
        pad = torch.arange(topk, dtype=torch.int64).expand(rows, length - cols, layers, topk)
        full = torch.cat([full, pad.to(full.device)], dim=1)
    seq_major = full.transpose(0, 1)  # [length, rows, layers, topk]
    if sequence_parallel and tp > 1:
        part = length // tp
        seq_major = seq_major[tp_rank * part:(tp_rank + 1) * part]
    return seq_major.reshape(-1, layers, topk)


def check_batch(routed: torch.Tensor, num_layers: int, topk: int, num_experts: int) -> None:
    """Refuse a routing that does not fit the model, naming what differs (`EngineError`)."""
    if routed.dim() != 4 or routed.shape[2] != num_layers or routed.shape[3] != topk:
        raise EngineError(f"routed_experts has shape {tuple(routed.shape)}; the model needs [rows, cols, "
                          f"{num_layers} layers, {topk} experts per token]")
    if routed.numel() and int(routed.max()) >= num_experts:
        raise EngineError(f"routed_experts names expert {int(routed.max())}; the model has {num_experts}")


def replay(found: list[tuple[int, Any]], target: torch.Tensor) -> None:
    """Have each router replay its layer's column of ``target`` in the forwards that follow."""
    from megatron.core.transformer.moe.router_replay import RouterReplayAction

    for layer, router in found:
        rr = router.router_replay
        rr.target_topk_idx = target[:, layer].contiguous()
        rr.set_router_replay_action(RouterReplayAction.REPLAY_FORWARD)


def release(found: list[tuple[int, Any]]) -> None:
    """Back to the router's own top-k; the targets (and megatron's backward list) dropped."""
    for _, router in found:
        router.router_replay.clear_indices()
        router.router_replay.clear_router_replay_action()
