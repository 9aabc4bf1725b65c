"""`trainer.offload` decides whether the trainer frees its state around each rollout phase.

Real megatron-core on CPU: with offload on, the context's offload empties the parameters'
storage and onload brings it back bit-exact; with `offload: false` both leave the model as it is
(the state never moves), and training goes on from the same weights.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import yaml
from dist_worker import fixed_batch, nll_loss
from tiny_models import make_tiny_hf_model

from tandem.sidecars.trainer.context import TrainerContext
from tandem.sidecars.trainer.megatron_engine import MegatronEngine
from tandem.spec.load import parse_job

pytestmark = pytest.mark.megatron
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny-grpo.yaml"


def _context(model_dir: Path, offload: bool) -> Any:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["trainer"]["offload"] = offload
    engine = MegatronEngine.from_hf(model_dir, lr=1e-2, seed=0)
    engine.train_step(fixed_batch(), nll_loss)  # optimizer state exists
    return SimpleNamespace(job=parse_job(doc), engine=engine, critic=None)


@pytest.mark.parametrize("offload", [True, False])
def test_offload_follows_the_spec(offload: bool, tmp_path: Path) -> None:
    ctx = _context(make_tiny_hf_model(tmp_path / "m", family="qwen2"), offload)
    before = {n: p.detach().clone() for n, p in ctx.engine.named_parameters()}
    TrainerContext.offload(ctx)
    freed = [p.untyped_storage().nbytes() == 0 for _, p in ctx.engine.named_parameters()]
    assert all(freed) if offload else not any(freed)
    TrainerContext.onload(ctx)
    for name, p in ctx.engine.named_parameters():
        assert torch.equal(p, before[name]), name
    assert ctx.engine.train_step(fixed_batch(), nll_loss)["update_ok"] == 1.0
