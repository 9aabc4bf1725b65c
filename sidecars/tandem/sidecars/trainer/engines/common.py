"""What every trainer engine shares, Megatron or FSDP2: the error type, the parallel layout, the process group,
this rank's device, reductions over the data-parallel ranks, and the reader of a HF directory's safetensors.

Callers: the engine protocol (interface.py), both engines (megatron_engine.py with megatron_build.py and
megatron_export.py; hf_engine.py with hf_weights.py), heads.py, and the trainer's loop (context, resume,
sharded, train_state). Imports neither Megatron nor transformers at import time (the Megatron data-parallel
group is looked up inside `_dp_group`).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors import safe_open

from tandem.checkpoint_engine.ports import free_port
from tandem.sidecars.trainer.engines import cpu_compat


class EngineError(RuntimeError):
    """The trainer engine cannot be built or used as asked."""


@dataclasses.dataclass(frozen=True)
class Parallelism:
    tp: int
    pp: int
    dp: int
    ep: int
    tp_rank: int
    pp_rank: int
    dp_rank: int
    ep_rank: int
    fsdp: bool = False  # the hf engine's layout: every forward is collective (FSDP2 gathers the weights)


def start_process_group() -> bool:
    """Start torch.distributed if needed (NCCL on GPU, gloo on CPU); whether this rank is on a GPU."""
    on_gpu = not cpu_compat.apply()
    if not torch.distributed.is_initialized():
        env = os.environ
        local_rank = int(env.get("LOCAL_RANK", "0"))
        if on_gpu:
            torch.cuda.set_device(local_rank)
        backend = "nccl" if on_gpu else "gloo"
        if "WORLD_SIZE" in env:  # torchrun or the sidecar's launcher: env:// rendezvous
            torch.distributed.init_process_group(
                backend=backend, rank=int(env["RANK"]), world_size=int(env["WORLD_SIZE"])
            )
        else:  # a single process: a private TCP store, the environment left untouched
            init = f"tcp://127.0.0.1:{free_port()}"
            torch.distributed.init_process_group(backend=backend, init_method=init, rank=0, world_size=1)
    return on_gpu


class SafetensorsDir:
    """Lazy name -> tensor access across the safetensors files of a HF directory."""

    def __init__(self, model_dir: Path) -> None:
        files = sorted(model_dir.glob("*.safetensors"))
        if not files:
            raise EngineError(f"no *.safetensors in {model_dir}")
        self._handles: list[Any] = [safe_open(str(f), framework="pt") for f in files]
        self._where: dict[str, Any] = {k: h for h in self._handles for k in h.keys()}  # noqa: SIM118

    def __call__(self, name: str) -> torch.Tensor:
        handle = self._where.get(name)
        if handle is None:
            raise KeyError(name)
        return handle.get_tensor(name)


def device() -> torch.device:
    """This rank's accelerator (the current CUDA device), or the CPU."""
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def dp_sum(par: Parallelism, values: list[float]) -> list[float]:
    """Sum of `values` over the data-parallel ranks (this rank's own when dp == 1)."""
    if par.dp == 1:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device())
    dist.all_reduce(t, group=_dp_group(par))
    return [float(v) for v in t.tolist()]


def accumulate(sums: dict[str, float], metrics: Mapping[str, float], weight: float = 1.0) -> None:
    """Adds one micro-batch's `metrics` to `sums`: a `*_max` metric keeps the largest value of the counted
    micro-batches (weight > 0), every other one its weighted sum. A filler micro-batch (weight 0) still adds
    every key, so that each rank holds the same keys for `step_metrics`' collective."""
    for k, v in metrics.items():
        if k.endswith("_max"):
            sums[k] = max(sums.get(k, -math.inf), float(v) if weight > 0 else -math.inf)
        else:
            sums[k] = sums.get(k, 0.0) + weight * float(v)


def step_metrics(par: Parallelism, sums: dict[str, float], total: int, reduction: str) -> dict[str, float]:
    """A train step's metrics: each one's mean over every micro-batch of every data-parallel rank (`sums`: this
    rank's sums over its counted micro-batches, the same keys on every rank; `total`: the micro-batches counted
    on all ranks), a `*_max` one the largest of them (`accumulate`); with reduction "sum" the loss is the sum
    itself. Collective over the dp ranks."""
    keys = sorted(k for k in sums if not k.endswith("_max"))
    peaks = sorted(k for k in sums if k.endswith("_max"))
    summed = dp_sum(par, [sums[k] for k in keys])
    metrics = {k: v / max(total, 1) for k, v in zip(keys, summed, strict=True)}
    if reduction == "sum" and "loss" in sums:
        metrics["loss"] = summed[keys.index("loss")]
    for k, v in zip(peaks, dp_max(par, [sums[k] for k in peaks]), strict=True):
        metrics[k] = v if math.isfinite(v) else 0.0
    return metrics


def dp_max(par: Parallelism, values: list[float]) -> list[float]:
    """The largest of `values` over the data-parallel ranks (this rank's own when dp == 1)."""
    if par.dp == 1 or not values:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=_dp_group(par))
    return [float(v) for v in t.tolist()]


def dp_gather(par: Parallelism, obj: Any) -> list[Any]:
    """Every data-parallel rank's `obj`, in dp-rank order (just `[obj]` when dp == 1)."""
    if par.dp == 1:
        return [obj]
    out: list[Any] = [None] * par.dp
    dist.all_gather_object(out, obj, group=_dp_group(par))
    return out


def _dp_group(par: Parallelism) -> Any:
    """The data-parallel group: Megatron's, or every rank for the hf engine (None: the default group)."""
    if par.fsdp:
        return None
    from megatron.core import parallel_state as ps

    return ps.get_data_parallel_group()
