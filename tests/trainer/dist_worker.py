"""Worker processes for the multi-rank trainer tests (TP=2, PP=2, EP=2, DP=2 over gloo on CPU).

Started by tests/trainer/test_megatron_parallel.py with torch.multiprocessing (spawn); each rank
builds a MegatronEngine, runs the same fixed script, and saves what it saw to ``out/rank{r}.pt``
for the test process to compare with a single-rank engine.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch


def fixed_batch() -> dict[str, torch.Tensor]:
    """Two packed rows with three samples; the same on every rank and in the test process."""
    gen = torch.Generator().manual_seed(7)
    ids = torch.randint(0, 128, (2, 12), generator=gen)
    seg = torch.tensor([[1] * 5 + [2] * 7, [1] * 9 + [0] * 3])
    return {"input_ids": ids * (seg != 0), "segment_ids": seg}


def nll_loss(
    logprobs: torch.Tensor, batch: Mapping[str, torch.Tensor]
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Mean negative log-likelihood of every non-first token of every sample (per micro-batch)."""
    seg = batch["segment_ids"]
    mask = torch.zeros_like(logprobs)
    mask[:, 1:] = ((seg[:, 1:] == seg[:, :-1]) & (seg[:, 1:] != 0)).float()
    loss = -(logprobs * mask).sum() / mask.sum().clamp(min=1)
    return loss, {"tokens": mask.sum()}


def value_mse(values: torch.Tensor, batch: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, Any]]:
    """A critic's squared error to per-sample targets (1.0 for segment 1, -0.5 otherwise)."""
    seg = batch["segment_ids"]
    mask = torch.zeros_like(values)
    mask[:, 1:] = ((seg[:, 1:] == seg[:, :-1]) & (seg[:, 1:] != 0)).float()
    target = torch.where(seg == 1, 1.0, -0.5)
    return ((values - target) ** 2 * mask).sum() / mask.sum().clamp(min=1), {}


def critic_script(model_dir: str, tp: int) -> dict[str, Any]:
    """A value-head engine at tensor parallelism `tp`: its values before and after 3 steps."""
    from tandem.sidecars.trainer.megatron_engine import MegatronEngine

    critic = MegatronEngine.from_hf(model_dir, tensor_parallel=tp, lr=1e-2, seed=0, value_head=True)
    batch = fixed_batch()
    out: dict[str, Any] = {"values0": critic.token_logprobs(batch)}
    out["losses"] = [critic.train_step(batch, value_mse, micro_batch_size=1)["loss"] for _ in range(3)]
    out["values"] = critic.token_logprobs(batch)
    return out


DP_SCRIPT = ((3, "mean"), (1, "sum"), (5, "sum"))  # (rows, reduction): uneven shares, an empty rank


def rows_batch(rows: int) -> dict[str, torch.Tensor]:
    """`rows` packed rows of two samples each (deterministic)."""
    gen = torch.Generator().manual_seed(100 + rows)
    ids = torch.randint(1, 128, (rows, 10), generator=gen)
    seg = torch.tensor([[1] * 4 + [2] * 6] * rows)
    return {"input_ids": ids, "segment_ids": seg}


def sharded_forward(engine: Any) -> dict[str, Any]:
    """Per-sample log-probs of a packed batch of 5 rows, computed on each dp rank's share and gathered."""
    from tandem.sidecars.algorithms.base import Sample, pack_samples
    from tandem.sidecars.trainer import sharded

    gen = torch.Generator().manual_seed(11)
    samples = [Sample(prompt_ids=torch.randint(1, 128, (8,), generator=gen).tolist(),
                      completion_ids=torch.randint(1, 128, (4 + i,), generator=gen).tolist(), group=i // 2)
               for i in range(5)]
    packed = pack_samples(samples, 24, pad_id=0)
    seen: list[int] = []

    def forward(rows: Any) -> torch.Tensor:
        seen.append(rows.num_rows)
        return torch.as_tensor(engine.token_logprobs(rows))

    lp, skipped = sharded.per_sample_outputs([forward, None], packed, engine.par)
    return {"rows": packed.num_rows, "logprobs": lp, "skipped": skipped, "forward_rows": seen}


def dp_script(engine: Any) -> list[dict[str, Any]]:
    """Further train steps whose global batches split unevenly over two data-parallel ranks."""
    out = []
    for rows, reduction in DP_SCRIPT:
        metrics = engine.train_step(rows_batch(rows), nll_loss, micro_batch_size=1, reduction=reduction)
        out.append({"metrics": metrics, "rows": engine.last_step_rows})
    return out


def copy_tensors(tensors: Iterable[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in tensors}  # exports may alias live parameters


def run(rank: int, world: int, port: int, out_dir: str, layouts: list[tuple[str, int, int, int]]) -> None:
    """Build an engine for each (model_dir, tp, pp, ep) layout in turn; save what rank ``rank`` saw."""
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    torch.set_num_threads(1)
    from megatron.core import parallel_state

    from tandem.sidecars.trainer.megatron_engine import MegatronEngine

    for model_dir, tp, pp, ep in layouts:
        engine = MegatronEngine.from_hf(
            model_dir, tensor_parallel=tp, pipeline_parallel=pp, expert_parallel=ep, lr=1e-2, seed=0
        )
        result: dict[str, Any] = {
            "export": copy_tensors(engine.export_hf()),
            "export_seconds": engine.last_export_seconds,
        }
        for target in range(2):
            result[f"slice{target}"] = copy_tensors(engine.export_hf(target_tp=2, target_rank=target))
        batch = fixed_batch()
        if tp * pp * ep == 1:  # before any training: the same weights as the single-rank engine
            result["sharded"] = sharded_forward(engine)
        result["logits"] = engine.logits(batch)
        result["logprobs"] = engine.token_logprobs(batch)
        result["train"] = engine.train_step(batch, nll_loss, micro_batch_size=1)
        result["export_after"] = copy_tensors(engine.export_hf())
        result["train_rows"] = engine.last_step_rows
        if tp == 2:  # a critic's value head lives on tensor-parallel rank 0 only
            result["critic"] = critic_script(model_dir, tp)
        if tp * pp * ep == 1:  # two ranks, one model copy each: data parallelism
            result["dp"] = dp_script(engine)
            result["export_dp"] = copy_tensors(engine.export_hf())
        result["local_names"] = [n for n, _ in engine.named_parameters()]
        torch.save(result, Path(out_dir) / f"tp{tp}pp{pp}ep{ep}-rank{rank}.pt")
        torch.distributed.barrier()
        parallel_state.destroy_model_parallel()
    torch.distributed.destroy_process_group()
