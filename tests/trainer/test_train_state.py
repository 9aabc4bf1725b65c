"""Training state beside a durable copy: restoring it continues training exactly where it stopped.

Real megatron-core on CPU (one rank, gloo) and a real `DurableStore` on disk. A policy and a PPO
critic train two steps, save their state as a persisting trainer does, and take a third step. Rebuilt
from the published weights plus that state, fresh engines take the same third step; rebuilt from
the weights alone (what a resume without training state does) they do not. A state written under
another layout, or a missing rank file, restores nothing and says why.
"""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from dist_worker import fixed_batch, nll_loss, value_mse
from tiny_models import make_tiny_hf_model

from tandem.checkpoint_engine.versions.durable import DurableStore
from tandem.sidecars.trainer.engines import megatron_build
from tandem.sidecars.trainer.engines.megatron_engine import MegatronEngine
from tandem.sidecars.trainer.loop.recovery import train_state

pytestmark = pytest.mark.megatron
VERSION = 3


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_hf_model(tmp_path_factory.mktemp("tiny-hf") / "qwen2", family="qwen2")


def engines(model_dir: Path, store: DurableStore | None, critic: bool = True) -> Any:
    """A context as `train_state` sees it: policy, critic, durable store."""
    policy = MegatronEngine.from_hf(model_dir, lr=1e-2, seed=0)
    value = MegatronEngine.from_hf(model_dir, lr=1e-2, seed=1, value_head=True) if critic else None
    return SimpleNamespace(engine=policy, critic=value, durable=store)


def step(ctx: Any) -> None:
    ctx.engine.train_step(fixed_batch(), nll_loss)
    if ctx.critic is not None:
        ctx.critic.train_step(fixed_batch(), value_mse)


def params(ctx: Any) -> dict[str, torch.Tensor]:
    out = {f"policy.{n}": p.detach().clone() for n, p in ctx.engine.named_parameters()}
    return out | {f"critic.{n}": p.detach().clone() for n, p in ctx.critic.named_parameters()}


def rebuilt(model_dir: Path, store: DurableStore, weights: dict[str, torch.Tensor]) -> Any:
    """Fresh engines with the published policy weights loaded, as `resume.load_version` does."""
    ctx = engines(model_dir, store)
    megatron_build.load_hf_weights(ctx.engine.gpt, weights.__getitem__, ctx.engine.shape, ctx.engine.par)
    return ctx


@pytest.fixture(scope="module")
def saved(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    store = DurableStore(tmp_path_factory.mktemp("volume"), "ns", "job", "uid-1")
    ctx = engines(model_dir, store)
    step(ctx)
    step(ctx)
    metrics = train_state.save(ctx, VERSION)
    weights = {n: t.clone() for n, t in ctx.engine.export_hf()}  # what the durable copy holds
    step(ctx)
    return {"store": store, "weights": weights, "want": params(ctx), "metrics": metrics}


def test_restored_state_takes_the_uninterrupted_step(model_dir: Path, saved: dict[str, Any]) -> None:
    store: DurableStore = saved["store"]
    assert (store.train_dir(VERSION) / "rank-00000.pt").is_file()
    assert saved["metrics"]["train_state_bytes"] > 0 and saved["metrics"]["train_state_s"] >= 0
    assert not list(store.train_dir(VERSION).glob(".tmp-*"))  # written by rename, nothing left over
    ctx = rebuilt(model_dir, store, saved["weights"])
    assert train_state.restore(ctx, VERSION) is True
    for engine in (ctx.engine, ctx.critic):  # as the trainer does between phases: the state must be releasable
        engine.offload()
        engine.onload()
    step(ctx)
    got = params(ctx)
    for name, want in saved["want"].items():
        assert torch.allclose(got[name], want, rtol=0, atol=1e-6), name


def test_without_state_the_next_step_differs(model_dir: Path, saved: dict[str, Any],
                                             caplog: pytest.LogCaptureFixture) -> None:
    """The control: weights alone (fresh Adam moments, an untrained critic) do not reproduce the step."""
    store: DurableStore = saved["store"]
    ctx = rebuilt(model_dir, store, saved["weights"])
    with caplog.at_level(logging.WARNING):
        assert train_state.restore(ctx, VERSION + 1) is False  # no state was written for that version
    assert f"{store.train_dir(VERSION + 1) / 'rank-00000.pt'} does not exist" in caplog.text
    step(ctx)
    got = params(ctx)
    name = "policy.decoder.layers.0.mlp.linear_fc1.weight"
    assert not torch.allclose(got[name], saved["want"][name], rtol=0, atol=1e-6)
    assert not torch.allclose(got["critic.output_layer.weight"], saved["want"]["critic.output_layer.weight"])


def test_a_state_from_another_layout_is_refused(model_dir: Path, saved: dict[str, Any],
                                                caplog: pytest.LogCaptureFixture) -> None:
    ctx = engines(model_dir, saved["store"], critic=False)  # the state was written with a critic
    with caplog.at_level(logging.WARNING):
        assert train_state.restore(ctx, VERSION) is False
    assert "was written with layout" in caplog.text and "'critic': 1" in caplog.text


def test_a_damaged_state_is_refused(model_dir: Path, saved: dict[str, Any], tmp_path: Path,
                                    caplog: pytest.LogCaptureFixture) -> None:
    store = DurableStore(tmp_path, "ns", "job", "uid-1")
    store.write_train_file(VERSION, "rank-00000.pt", lambda p: p.write_bytes(b"not a torch file"))
    ctx = engines(model_dir, store)
    with caplog.at_level(logging.WARNING):
        assert train_state.restore(ctx, VERSION) is False
    assert "is unreadable" in caplog.text
