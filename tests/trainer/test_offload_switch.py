"""`trainer.offload` decides whether the trainer frees its accelerator state around each rollout phase.

Real megatron-core on CPU, where there is no accelerator memory to free: the switch (`loop/phases/switch.py`) leaves the
state where it is whatever the spec says (a host copy of host memory would free nothing and double
the trainer's resident memory), and training goes on from the same weights. The copy itself
(`HostOffloader`, the GPU path) is tested bit-exact on CPU in test_megatron_engine.py.
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

from tandem.sidecars.trainer.engines.megatron_engine import MegatronEngine
from tandem.sidecars.trainer.loop.phases import switch
from tandem.spec.load import parse_job

pytestmark = pytest.mark.megatron
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny-grpo.yaml"


def _context(model_dir: Path, offload: bool) -> Any:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["trainer"]["offload"] = offload
    engine = MegatronEngine.from_hf(model_dir, lr=1e-2, seed=0)
    engine.train_step(fixed_batch(), nll_loss)  # optimizer state exists
    ctx = SimpleNamespace(job=parse_job(doc), engine=engine, critic=None)
    return ctx


@pytest.mark.parametrize("offload", [True, False])
def test_offload_follows_the_spec(offload: bool, tmp_path: Path) -> None:
    ctx = _context(make_tiny_hf_model(tmp_path / "m", family="qwen2"), offload)
    before = {n: p.detach().clone() for n, p in ctx.engine.named_parameters()}
    switch.offload(ctx)
    assert not switch.offloads(ctx)
    freed = [p.untyped_storage().nbytes() == 0 for _, p in ctx.engine.named_parameters()]
    assert not any(freed)
    assert not ctx.engine._offloader.offloaded
    switch.onload(ctx)
    for name, p in ctx.engine.named_parameters():
        assert torch.equal(p, before[name]), name
    assert ctx.engine.train_step(fixed_batch(), nll_loss)["update_ok"] == 1.0


@pytest.mark.parametrize(("offload", "device", "moves"), [
    (True, "cuda", True), (False, "cuda", False), (True, "cpu", False), (False, "cpu", False)])
def test_state_moves_only_off_an_accelerator(offload: bool, device: str, moves: bool) -> None:
    assert switch.moves_state(offload, torch.device(device)) is moves
