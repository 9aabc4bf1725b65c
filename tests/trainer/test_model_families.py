"""Each model family through the project's own Megatron path, against transformers' forward.

For Llama (incl. Llama 3.x ``llama3`` RoPE scaling), Qwen2 (q/k/v biases) and Qwen3 (per-head
q/k RMSNorm, head_dim != hidden / heads), tied and untied: a tiny random HF checkpoint is loaded
by ``MegatronEngine.from_hf`` (ModelShape -> megatron_build -> convert.from_hf), its logits are
compared with the HF model's, and its parameters mapped back by ``convert.to_hf`` must equal the
checkpoint's tensors. Runs megatron-core on CPU, one rank.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from tiny_models import make_tiny_hf_model

from tandem.checkpoint_engine import convert
from tandem.sidecars.trainer.engines.megatron_build import global_name, layer_numbers
from tandem.sidecars.trainer.engines.megatron_engine import MegatronEngine

pytestmark = pytest.mark.megatron

TOLERANCE = 1e-4  # fp32; measured differences are ~1e-6
# Llama 3.2's RoPE (factor 32) with the fixed megatron-core parameters (low 1, high 4, original 8192)
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 32.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
CASES: dict[str, dict[str, Any]] = {
    "llama-tied": dict(family="llama", tie=True),  # SmolLM2's layout
    "llama-untied": dict(family="llama", tie=False),
    "qwen2-tied": dict(family="qwen2", tie=True),
    "qwen2-untied": dict(family="qwen2", tie=False),
    "qwen3-tied": dict(family="qwen3", tie=True, head_dim=32),  # hidden 64 / 4 heads would be 16
    "qwen3-untied": dict(family="qwen3", tie=False, head_dim=32),
    "llama3-rope": dict(family="llama", tie=True, rope_parameters=LLAMA3_ROPE, max_position_embeddings=131072),
}


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    return {case: make_tiny_hf_model(root / case, **options) for case, options in CASES.items()}


@pytest.fixture(scope="module")
def engines(model_dirs: dict[str, Path]) -> Iterator[dict[str, MegatronEngine]]:
    yield {case: MegatronEngine.from_hf(d, trainable=False, seed=0) for case, d in model_dirs.items()}


def _hf_logits(model_dir: Path, ids: torch.Tensor, **config: Any) -> torch.Tensor:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, **config).eval()
    with torch.no_grad():
        return model(ids).logits  # type: ignore[no-any-return]


def _megatron_logits(engine: MegatronEngine, ids: torch.Tensor) -> torch.Tensor:
    return engine.logits({"input_ids": ids, "segment_ids": torch.ones_like(ids)})


def _full_named(engine: MegatronEngine) -> list[tuple[str, torch.Tensor]]:
    """The engine's parameters with global names (TP=PP=1: they are already full tensors)."""
    numbers = layer_numbers(engine.gpt)
    return [(global_name(n, numbers, 0), p.detach()) for n, p in engine.gpt.named_parameters()]


@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_match_transformers(case: str, engines: dict[str, MegatronEngine], model_dirs: dict[str, Path]) -> None:
    ids = torch.randint(0, 128, (2, 24), generator=torch.Generator().manual_seed(3))
    want = _hf_logits(model_dirs[case], ids)
    got = _megatron_logits(engines[case], ids)
    assert got.shape == want.shape
    diff = (got - want).abs().max().item()
    print(f"{case}: max |logit diff| = {diff:.2e}")
    assert diff < TOLERANCE


@pytest.mark.parametrize("case", sorted(CASES))
def test_parameters_map_back_to_the_checkpoint(
    case: str, engines: dict[str, MegatronEngine], model_dirs: dict[str, Path]
) -> None:
    engine = engines[case]
    named = _full_named(engine)
    # the family's mapping names exactly the parameters megatron built
    assert sorted(n for n, _ in named) == sorted(convert.family(engine.shape).megatron_names(engine.shape))
    want = load_file(str(model_dirs[case] / "model.safetensors"))
    got = dict(convert.to_hf(engine.shape, named))
    assert sorted(got) == sorted(want)
    assert ("lm_head.weight" in got) is (not CASES[case]["tie"])
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor), name


def test_qwen3_has_per_head_qk_norms(engines: dict[str, MegatronEngine]) -> None:
    params = dict(_full_named(engines["qwen3-untied"]))
    assert engines["qwen3-untied"].shape.head_dim == 32
    assert params["decoder.layers.1.self_attention.q_layernorm.weight"].shape == (32,)
    assert params["decoder.layers.1.self_attention.k_layernorm.weight"].shape == (32,)
    assert params["decoder.layers.0.self_attention.linear_qkv.weight"].shape == ((4 + 2 * 2) * 32, 64)
    assert "decoder.layers.0.self_attention.linear_qkv.bias" not in params


def test_llama3_rope_scaling_changes_logits_and_matches(
    engines: dict[str, MegatronEngine], model_dirs: dict[str, Path]
) -> None:
    """A sequence long enough that the scaled low frequencies matter: unscaled RoPE is far off."""
    model_dir, engine = model_dirs["llama3-rope"], engines["llama3-rope"]
    assert engine.shape.rope_scaling_factor == 32.0
    ids = torch.randint(0, 128, (1, 512), generator=torch.Generator().manual_seed(4))
    want = _hf_logits(model_dir, ids)
    unscaled = _hf_logits(model_dir, ids, rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
    got = _megatron_logits(engine, ids)
    effect = (want - unscaled).abs().max().item()
    diff = (got - want).abs().max().item()
    print(f"llama3 rope: max |logit diff| = {diff:.2e}, effect of the scaling = {effect:.2e}")
    assert effect > 100 * TOLERANCE
    assert diff < TOLERANCE
