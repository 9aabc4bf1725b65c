"""Qwen3 (per-head q/k RMSNorm, head_dim != hidden / heads) at tensor parallelism 2, two gloo ranks.

Each TP rank holds half the query groups but a full copy of the q/k norm weights, so their
gradients are partial per rank and Megatron must sum them over the TP group (it does so when
``TransformerConfig.qk_layernorm`` is set). Checks: TP=2 logits equal transformers'; the shards
merged and mapped back equal the checkpoint; after a training step every rank's q/k norm gradient
equals the single-rank gradient.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import dist_worker
import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file
from tiny_models import make_tiny_hf_model

from tandem.checkpoint_engine import convert
from tandem.checkpoint_engine.etcd.local_etcd import free_port

pytestmark = pytest.mark.megatron
QK_NORM = ("q_layernorm.weight", "k_layernorm.weight")


def _script(model_dir: str, tp: int) -> dict[str, Any]:
    """What one rank sees: logits, its parameter shards, a training step and its q/k norm grads."""
    from tandem.sidecars.trainer.engines.megatron_build import global_name, layer_numbers
    from tandem.sidecars.trainer.engines.megatron_engine import MegatronEngine

    engine = MegatronEngine.from_hf(model_dir, tensor_parallel=tp, lr=1e-2, seed=0)
    numbers = layer_numbers(engine.gpt)
    batch = dist_worker.fixed_batch()
    seen: dict[str, Any] = {
        "logits": engine.logits(batch),
        "shards": {global_name(n, numbers, 0): p.detach().clone() for n, p in engine.named_parameters()},
    }
    seen["train"] = engine.train_step(batch, dist_worker.nll_loss, micro_batch_size=1)
    seen["qk_grads"] = {
        global_name(n, numbers, 0): p.main_grad.detach().clone()
        for n, p in engine.named_parameters()
        if n.endswith(QK_NORM)
    }
    return seen


def _rank(rank: int, world: int, port: int, out_dir: str, model_dir: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    torch.save(_script(model_dir, tp=world), Path(out_dir) / f"rank{rank}.pt")
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_hf_model(tmp_path_factory.mktemp("qwen3") / "m", family="qwen3", tie=False, head_dim=32)


@pytest.fixture(scope="module")
def ranks(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("ranks")
    mp.start_processes(_rank, args=(2, free_port(), str(out), str(model_dir)), nprocs=2, start_method="spawn")
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


def test_tp2_logits_match_transformers(ranks: list[dict[str, Any]], model_dir: Path) -> None:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    batch = dist_worker.fixed_batch()
    for row in range(2):  # one sample per call: HF has no packed rows
        seg = batch["segment_ids"][row]
        for sample in (1, 2):
            at = (seg == sample).nonzero().flatten()
            if not len(at):
                continue
            with torch.no_grad():
                want = model(batch["input_ids"][row, at][None]).logits[0]
            for seen in ranks:
                assert (seen["logits"][row, at] - want).abs().max().item() < 1e-4


def test_tp2_shards_merge_back_to_the_checkpoint(ranks: list[dict[str, Any]], model_dir: Path) -> None:
    shards = [seen["shards"] for seen in ranks]
    for name in QK_NORM:  # replicated: the whole [head_dim] norm on each rank
        full = f"decoder.layers.0.self_attention.{name}"
        assert shards[0][full].shape == (32,) and torch.equal(shards[0][full], shards[1][full])
    shape = convert.ModelShape.from_hf_dir(model_dir).with_padded_vocab(2)
    merged = [(n, convert.merge_tp(n, [s[n] for s in shards])) for n in shards[0]]
    got = dict(convert.to_hf(shape, merged))
    want = load_file(str(model_dir / "model.safetensors"))
    assert sorted(got) == sorted(want)
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor), name


def test_tp2_qk_norm_grads_are_summed_over_ranks(ranks: list[dict[str, Any]], model_dir: Path) -> None:
    single = _script(str(model_dir), tp=1)
    assert len(single["qk_grads"]) == 4  # 2 layers x (q, k)
    for name, want in single["qk_grads"].items():
        assert want.abs().max() > 0, name
        for seen in ranks:  # a rank's own heads alone would give a partial gradient
            assert torch.allclose(seen["qk_grads"][name], want, atol=1e-6, rtol=1e-4), name
    assert abs(ranks[0]["train"]["grad_norm"] - single["train"]["grad_norm"]) < 1e-4
