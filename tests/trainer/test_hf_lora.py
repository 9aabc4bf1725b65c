"""LoRA on the hf trainer engine (`trainer.lora`) against PEFT and transformers themselves.

A fresh adapter (B = 0) leaves the model's log-probs exactly transformers'; a GRPO step moves the adapters
only; the merged version the engine publishes equals PEFT's own `merge_and_unload` of the same adapters and,
saved as a HF directory, gives transformers the engine's log-probs, as does the PEFT adapter directory the
engine writes, loaded by PEFT onto the base model; weights loaded by HF name become the base
with the adapters reset.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from test_hf_engine import _grpo_step, _transformers_logprobs
from tiny_models import grouped_samples, make_tiny_hf_model

from tandem.sidecars.algorithms.algorithm_interface import pack_samples, row_budget
from tandem.sidecars.trainer.engines.heads import shift_to_labels
from tandem.sidecars.trainer.engines.hf_engine import HFEngine

LORA = SimpleNamespace(rank=4, alpha=8.0, target_modules=["all-linear"], dropout=0.0)


@pytest.fixture(scope="module", params=["llama", "gemma"])  # untied, and tied (the head is the embedding)
def model_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_hf_model(tmp_path_factory.mktemp("lora") / request.param, family=request.param)


def _logprobs(engine: HFEngine, samples: Any) -> list[torch.Tensor]:
    batch = pack_samples(samples, row_budget(samples, share_prompts=True), share_prompts=True)
    got = batch.unpack(shift_to_labels(engine.token_logprobs(batch)))
    return [got[i] for i in range(len(samples))]


def _close(got: list[torch.Tensor], want: list[torch.Tensor], tol: float = 1e-5) -> None:
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert (g - w).abs().max().item() < tol, i


def test_adapters_train_and_publish_merged_as_peft_merges_them(model_dir: Path, tmp_path: Path) -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    samples = grouped_samples(4)
    engine = HFEngine.from_hf(model_dir, lr=1e-2, lora=LORA)
    _close(_logprobs(engine, samples), _transformers_logprobs(model_dir, samples))  # B = 0: the base model
    trained = {n for n, p in engine.model.named_parameters() if p.requires_grad}
    assert trained and all(".lora_A." in n or ".lora_B." in n for n in trained)
    before = {n: t.clone() for n, t in engine.named_parameters()}
    for _ in range(2):
        metrics = _grpo_step(engine, samples)
        assert metrics["update_ok"] == 1.0 and metrics["grad_norm"] > 0
    after = dict(engine.named_parameters())
    for name, tensor in before.items():
        moved = not torch.equal(after[name], tensor)
        assert moved == (name in trained or ".lora_B." in name), name  # the adapters moved, nothing else
    # PEFT's own merge of the engine's adapters into the same base model is what the engine publishes
    reference = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
                               LoraConfig(r=4, lora_alpha=8.0, target_modules="all-linear", lora_dropout=0.0))
    missing, unexpected = reference.load_state_dict(after, strict=False)
    assert not unexpected and set(missing) <= {"base_model.model.lm_head.weight"}  # a tied head is the embedding
    merged = reference.merge_and_unload().state_dict()
    published = dict(engine.export_hf())
    assert set(published) == set(merged) - ({"lm_head.weight"} if engine.shape.tie_embeddings else set())
    for name, tensor in published.items():
        assert (tensor - merged[name]).abs().max().item() < 1e-6, name
    saved = engine.save_hf(tmp_path / "merged", model_dir)
    _close(_transformers_logprobs(saved, samples), _logprobs(engine, samples))  # what vLLM loads is what trains
    # the adapters alone, as a PEFT adapter directory that PEFT loads onto the base model
    from peft import PeftModel

    adapter = engine.write_adapter(tmp_path / "adapter")
    assert adapter is not None and (adapter / "adapter_model.safetensors").stat().st_size < \
        (saved / "model.safetensors").stat().st_size / 2
    peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
                                           str(adapter)).eval()
    merged_dir = tmp_path / "peft-merged"
    peft_model.merge_and_unload().save_pretrained(merged_dir)
    for name in ("tokenizer_config.json", "config.json"):
        if (model_dir / name).exists() and not (merged_dir / name).exists():
            (merged_dir / name).write_text((model_dir / name).read_text())
    _close(_transformers_logprobs(merged_dir, samples), _logprobs(engine, samples))


def test_loaded_weights_become_the_base_with_fresh_adapters(model_dir: Path, tmp_path: Path) -> None:
    samples = grouped_samples(5)
    other = make_tiny_hf_model(tmp_path / "other", family=model_dir.name, seed=3)
    engine = HFEngine.from_hf(model_dir, lr=1e-2, lora=LORA)
    _grpo_step(engine, samples)  # adapters away from zero
    assert engine.load_hf_weights(other) == sum(1 for n, _ in engine.named_parameters() if ".lora_" not in n)
    _close(_logprobs(engine, samples), _transformers_logprobs(other, samples))


def test_adapter_versions_carry_the_adapters_alone_and_load_back_exactly(model_dir: Path) -> None:
    """trainer.lora.sync adapter: `export_adapters` gives PEFT's saved adapter tensors (nothing of the base),
    the rollout side's merge of them (checkpoint_engine.versions.adapters, as vLLM and the export apply them) equals
    the engine's own merged weights, and a fresh engine that loads them over the base computes exactly the
    trained engine's log-probs."""
    from peft import get_peft_model_state_dict

    from tandem.checkpoint_engine.versions import adapters

    samples = grouped_samples(6)
    engine = HFEngine.from_hf(model_dir, lr=1e-2, lora=LORA)
    for _ in range(2):
        _grpo_step(engine, samples)
    exported = dict(engine.export_adapters())
    theirs = {k: t.full_tensor() if hasattr(t, "full_tensor") else t  # FSDP2's DTensors, whole
              for k, t in get_peft_model_state_dict(engine.model).items()}
    assert set(exported) == set(theirs) and all(torch.equal(exported[k], theirs[k]) for k in exported)
    config = engine.adapter_config()
    assert config["r"] == 4 and config["lora_alpha"] == 8.0 and config["base_model_name_or_path"] == str(model_dir)
    whole = dict(engine.export_hf())
    applied = dict(adapters.merged(adapters.base_weights(model_dir), exported, config))
    for name, tensor in whole.items():
        assert (applied[name] - tensor).abs().max().item() < 1e-6, name
    fresh = HFEngine.from_hf(model_dir, lr=1e-2, lora=LORA)
    assert fresh.load_adapter_version(exported.__getitem__) == sum(1 for _ in fresh.named_parameters())
    _close(_logprobs(fresh, samples), _logprobs(engine, samples), tol=1e-6)
