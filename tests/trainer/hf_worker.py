"""Worker of the two-rank hf-engine test (tests/trainer/test_hf_engine.py): FSDP2 over gloo ranks.

Each spawned rank builds an `HFEngine` on the same tiny model, runs `script` (log-probs, one train step
on a batch whose rows the ranks share unevenly, the export after it) and saves what it saw to
`out/hf-rank{r}.pt` for the test process to compare with one rank.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from dist_worker import copy_tensors, join, nll_loss


def uneven_batch() -> dict[str, torch.Tensor]:
    """Three packed rows: with two ranks, one trains on two and the other on one (and a filler micro-batch)."""
    gen = torch.Generator().manual_seed(11)
    seg = torch.tensor([[1] * 5 + [2] * 7, [1] * 9 + [0] * 3, [1] * 3 + [2] * 3 + [3] * 6])
    return {"input_ids": torch.randint(1, 128, (3, 12), generator=gen) * (seg != 0), "segment_ids": seg}


def script(model_dir: str, dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    from tandem.sidecars.trainer.engines.hf_engine import HFEngine

    engine = HFEngine.from_hf(model_dir, lr=1e-2, seed=0, dtype=dtype)
    batch = uneven_batch()
    logprobs = engine.token_logprobs(batch, micro_batch_size=1)
    train = engine.train_step(batch, nll_loss, micro_batch_size=1)
    return {"logprobs": logprobs, "train": train, "rows": engine.last_step_rows,
            "export_after": copy_tensors(engine.export_hf())}


def run(rank: int, world: int, port: int, out_dir: str, model_dir: str) -> None:
    join(rank, world, port)
    torch.save(script(model_dir), Path(out_dir) / f"hf-rank{rank}.pt")
