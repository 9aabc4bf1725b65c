"""Training state of the hf engine beside a durable copy: a resume continues training exactly.

transformers + FSDP2 (one gloo rank) and a real `DurableStore`. A policy trains two steps, saves its state as
a persisting trainer does, and takes a third. A fresh engine that loads the published weights (as
`resume.load_version` does) and restores that state takes the same third step. With LoRA the published
version holds the merged weights, so the state carries the adapters, and restoring puts the base model's own
weights back under them; from the weights alone (no state) the third step differs.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from dist_worker import fixed_batch, nll_loss
from tiny_models import make_tiny_hf_model

from tandem.checkpoint_engine.versions.durable import DurableStore
from tandem.sidecars.trainer.engines.hf_engine import HFEngine
from tandem.sidecars.trainer.loop.recovery import train_state

VERSION = 5
LORA = SimpleNamespace(rank=4, alpha=8.0, target_modules=["all-linear"], dropout=0.0)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_hf_model(tmp_path_factory.mktemp("tiny-hf-state") / "gemma", family="gemma")


def _ctx(model_dir: Path, store: DurableStore, lora: bool) -> Any:
    return SimpleNamespace(engine=HFEngine.from_hf(model_dir, lr=1e-2, seed=0, lora=LORA if lora else None),
                           critic=None, durable=store)


def _params(ctx: Any) -> dict[str, torch.Tensor]:
    return {n: t.detach().clone() for n, t in ctx.engine.named_parameters()}


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_restored_state_takes_the_uninterrupted_step(model_dir: Path, tmp_path: Path, lora: bool) -> None:
    store = DurableStore(tmp_path, "ns", "job", "uid-1")
    ctx = _ctx(model_dir, store, lora)
    for _ in range(2):
        ctx.engine.train_step(fixed_batch(), nll_loss)
    train_state.save(ctx, VERSION)
    published = {n: t.clone() for n, t in ctx.engine.export_hf()}  # merged, with LoRA
    ctx.engine.train_step(fixed_batch(), nll_loss)
    want = _params(ctx)

    for restore in (True, False):
        again = _ctx(model_dir, store, lora)
        again.engine.load_hf_weights(published.__getitem__)  # resume.load_version
        assert train_state.restore(again, VERSION if restore else VERSION + 1) is restore
        again.engine.train_step(fixed_batch(), nll_loss)
        got = _params(again)
        same = all(torch.allclose(got[n], w, rtol=0, atol=1e-6) for n, w in want.items())
        assert same is restore, f"restore={restore}"
