"""Collective export of a Megatron model as full, HF-named tensors on one rank.

Called by :meth:`MegatronEngine.export_hf` on EVERY rank of the job (the gathers are collective);
the tensors come out on the exporting rank (data-parallel 0, tensor-parallel 0, first pipeline
stage) and the iterator is empty elsewhere. Steps, streaming one parameter at a time:

1. tensor parallelism: all-gather each parameter over its TP group and merge the shards
   (:func:`tandem.checkpoint_engine.convert.merge_tp`);
2. expert parallelism: each EP rank's local experts are all-gathered over the EP group and
   renamed with global expert numbers (``ep_rank * experts_per_rank + local``);
3. pipeline parallelism: every later stage sends its (already global-numbered) layers to the
   first stage, announcing names, shapes and dtypes first;
4. the HF mapping of the model's family renames and splits fused tensors.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from tandem.checkpoint_engine import convert
from tandem.checkpoint_engine.convert import ModelShape
from tandem.sidecars.trainer.engines import common
from tandem.sidecars.trainer.engines.common import Parallelism
from tandem.sidecars.trainer.engines.megatron_build import global_name, layer_numbers


def _stage_tensors(gpt: Any, shape: ModelShape, par: Parallelism) -> Iterator[tuple[str, torch.Tensor]]:
    """This stage's parameters, full (TP and EP gathered), with global names. Collective."""
    from megatron.core import parallel_state as ps

    numbers = layer_numbers(gpt)
    tp_group = ps.get_tensor_model_parallel_group()
    ep_group = ps.get_expert_model_parallel_group() if par.ep > 1 else None
    per_rank = shape.num_experts // par.ep if shape.num_experts else 0
    for local_name, param in gpt.named_parameters():
        if local_name == "output_layer.weight" and shape.tie_embeddings:
            continue  # the last stage's copy of the tied embedding
        data = param.detach().contiguous()
        if par.tp > 1:
            shards = [torch.empty_like(data) for _ in range(par.tp)]
            dist.all_gather(shards, data, group=tp_group)
            data = convert.merge_tp(local_name, shards)
        if ep_group is not None and ".local_experts." in local_name:
            copies = [torch.empty_like(data) for _ in range(par.ep)]
            dist.all_gather(copies, data, group=ep_group)
            for ep_rank, tensor in enumerate(copies):
                yield global_name(local_name, numbers, ep_rank * per_rank), tensor
            continue
        yield global_name(local_name, numbers, 0), data


def export_megatron(gpt: Any, shape: ModelShape, par: Parallelism) -> Iterator[tuple[str, torch.Tensor]]:
    """Full Megatron tensors with global names, on the exporting rank only. Collective."""
    from megatron.core import parallel_state as ps

    if par.dp_rank != 0 and par.ep == 1:
        return
    exporting = par.dp_rank == 0 and par.tp_rank == 0 and par.pp_rank == 0
    own = _stage_tensors(gpt, shape, par)
    if par.dp_rank != 0 or par.tp_rank != 0:
        for _ in own:  # take part in the TP / EP gathers only
            pass
        return
    if par.pp_rank == 0:
        yield from own
    if par.pp == 1:
        return
    group = ps.get_pipeline_model_parallel_group()
    ranks = dist.get_process_group_ranks(group)
    for stage in range(1, par.pp):
        if par.pp_rank == stage:
            tensors = list(own)  # gathered before announcing: the peers wait for the metadata
            meta: list[Any] = [[(n, tuple(t.shape), t.dtype) for n, t in tensors]]
        else:
            meta = [None]
        dist.broadcast_object_list(meta, src=ranks[stage], group=group)
        if par.pp_rank == stage:
            for _, tensor in tensors:
                dist.send(tensor, dst=ranks[0], group=group)
        elif exporting:
            for name, size, dtype in meta[0]:
                buffer = torch.empty(size, dtype=dtype, device=common.device())
                dist.recv(buffer, src=ranks[stage], group=group)
                yield name, buffer


def export_hf(
    gpt: Any, shape: ModelShape, par: Parallelism, target_tp: int = 1, target_rank: int = 0
) -> Iterator[tuple[str, torch.Tensor]]:
    """HF-named tensors, sliced for vLLM rollout rank ``target_rank`` of ``target_tp``. Collective."""
    hf = convert.to_hf(shape, export_megatron(gpt, shape, par))
    yield from convert.slice_for_rollout(shape, hf, target_tp, target_rank)
