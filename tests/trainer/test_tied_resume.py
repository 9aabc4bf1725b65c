"""Tied and untied embeddings through durable copies and resume: trainer export -> published version ->
`DurableStore` copy (the pod's shared memory then gone) -> `resume.resume_point` into a fresh engine.

Real megatron-core on CPU (one rank, gloo), the real store on disk, and the driver's own resume entry
(with a stand-in context: one rank, no etcd). For Qwen2 and Llama, tied and untied (and a bfloat16
tied Llama, the SmolLM2 case): a trained engine publishes its weights and training state; a fresh
engine resumed from the durable copy has bit-identical parameters and logits, takes the same next
training step as the engine that never stopped, and the durable copy exported as a HF directory gives
transformers the trainer's logits. A tied version carries no lm_head.weight; an untied one carries its
own head.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from dist_worker import fixed_batch, nll_loss
from tiny_models import make_tiny_hf_model

from tandem.checkpoint_engine.versions import layout, version_writer
from tandem.checkpoint_engine.versions.durable import DurableStore
from tandem.checkpoint_engine.versions.hf_export import export_version
from tandem.sidecars.trainer.engines.megatron_engine import MegatronEngine
from tandem.sidecars.trainer.loop.recovery import resume, train_state

pytestmark = pytest.mark.megatron
VERSION, ITERATION = 5, 7
CASES = {  # name: (family, tied, dtype)
    "qwen2-tied": ("qwen2", True, torch.float32),
    "qwen2-untied": ("qwen2", False, torch.float32),
    "llama-tied": ("llama", True, torch.float32),
    "llama-untied": ("llama", False, torch.float32),
    "llama-tied-bf16": ("llama", True, torch.bfloat16),
}


def params(engine: MegatronEngine) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in engine.named_parameters()}


def differing(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> list[str]:
    assert sorted(a) == sorted(b)
    return [n for n in a if not torch.equal(a[n], b[n])]


@pytest.mark.parametrize("case", list(CASES))
def test_resume_from_durable_copy_restores_the_trained_model(case: str, tmp_path: Path) -> None:
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    family, tied, dtype = CASES[case]
    model_dir = make_tiny_hf_model(tmp_path / "hf", family=family, tie=tied, seed=3)
    shm = tmp_path / "shm"  # a pod's shared memory
    store = DurableStore(tmp_path / "volume", "ns", "job", "uid-1", keep=2)
    batch = fixed_batch()  # packed: two samples share a row
    probe = torch.randint(0, 128, (1, 16), generator=torch.Generator().manual_seed(9))
    one = {"input_ids": probe, "segment_ids": torch.ones_like(probe)}  # one sample, as transformers sees it

    def engine() -> MegatronEngine:
        return MegatronEngine.from_hf(model_dir, lr=1e-2, seed=0, dtype=dtype)

    trained = engine()
    assert ("output_layer.weight" in dict(trained.named_parameters())) is not tied  # one shared matrix if tied
    for _ in range(2):
        trained.train_step(batch, nll_loss)
    train_state.save(SimpleNamespace(engine=trained, critic=None, durable=store), VERSION)
    published = version_writer.write_version(shm, "job", VERSION, trained.export_hf())
    names = {t.name for t in published.index.tensors}
    assert ("lm_head.weight" in names) is not tied, "a tied version carries no output head"
    if not tied:
        tensors = dict(layout.MappedVersion(published.path).tensors())
        assert not torch.equal(tensors["lm_head.weight"], tensors["model.embed_tokens.weight"])
    store.save(published.path, VERSION, iteration=ITERATION)
    shutil.rmtree(published.path)  # the pod (and its /dev/shm) is gone: only the durable copy is left
    want, want_logits, want_one = params(trained), trained.logits(batch), trained.logits(one)
    want_step = trained.train_step(batch, nll_loss)["loss"]
    want_after = params(trained)

    fresh = engine()
    assert differing(params(fresh), want), "a fresh engine must start from other weights than the trained one"
    ctx = SimpleNamespace(engine=fresh, critic=None, durable=store, registry=None, is_driver=True,
                          broadcast=lambda obj: obj, env=SimpleNamespace(shm_dir=shm, job="job", namespace="ns"))
    assert resume.resume_point(ctx) == (VERSION, ITERATION)  # type: ignore[arg-type]
    assert differing(params(fresh), want) == [], "resumed parameters must equal the trained ones bit for bit"
    assert torch.equal(fresh.logits(batch), want_logits)
    # the restored optimizer state: the next step is the step of the engine that never stopped
    assert fresh.train_step(batch, nll_loss)["loss"] == want_step
    assert differing(params(fresh), want_after) == []

    if dtype == torch.float32:  # the durable copy as a HF directory: transformers computes the trainer's logits
        copy = store.latest()
        assert copy is not None and copy.version == VERSION
        out = export_version(copy.path, model_dir, tmp_path / "export")
        with safe_open(str(out / "model.safetensors"), "pt") as f:
            assert ("lm_head.weight" in set(f.keys())) is not tied
        hf: Any = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
        assert hf.config.tie_word_embeddings is tied
        with torch.no_grad():
            gap = (hf(probe).logits - want_one).abs().max().item()
        assert gap < 1e-5, f"transformers on the export vs the trainer: logits differ by {gap}"
