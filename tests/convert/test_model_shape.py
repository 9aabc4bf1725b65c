"""ModelShape read from real-world config.json layouts: what each family supports and refuses.

The configs are those of the published checkpoints (SmolLM2-135M, Llama 3.2 1B in the
transformers 4 layout, Qwen2.5-0.5B, Qwen3-0.6B) and of transformers 5's ``rope_parameters``
layout; refusals must name the config key. No megatron, no weights.
"""

from __future__ import annotations

from typing import Any

import pytest

from tandem.checkpoint_engine import convert
from tandem.checkpoint_engine.convert import ConversionError, ModelShape

SMOLLM2_135M: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576, "intermediate_size": 1536,
    "num_attention_heads": 9, "num_hidden_layers": 30, "num_key_value_heads": 3, "head_dim": 64,
    "rms_norm_eps": 1e-05, "rope_theta": 100000, "rope_scaling": None, "tie_word_embeddings": True,
    "vocab_size": 49152, "max_position_embeddings": 8192, "hidden_act": "silu", "attention_bias": False,
    "mlp_bias": False, "pretraining_tp": 1,
}
LLAMA32_1B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192,
    "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8, "head_dim": 64,
    "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "tie_word_embeddings": True, "vocab_size": 128256,
    "max_position_embeddings": 131072, "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
}
QWEN25_05B: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864,
    "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "sliding_window": 32768, "use_sliding_window": False, "max_window_layers": 21,
    "tie_word_embeddings": True, "vocab_size": 151936, "max_position_embeddings": 32768, "hidden_act": "silu",
}
QWEN3_06B: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 1024, "intermediate_size": 3072,
    "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8, "head_dim": 128,
    "rms_norm_eps": 1e-06, "rope_theta": 1000000, "rope_scaling": None, "attention_bias": False,
    "use_sliding_window": False, "sliding_window": None, "max_window_layers": 28, "tie_word_embeddings": True,
    "vocab_size": 151936, "max_position_embeddings": 40960, "hidden_act": "silu",
}


def _with(config: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {**config, **changes}


def test_published_configs_are_read() -> None:
    smol = ModelShape.from_hf_config(SMOLLM2_135M)
    assert (smol.family, smol.head_dim, smol.tie_embeddings, smol.rope_theta) == ("llama", 64, True, 1e5)
    assert (smol.qkv_bias, smol.qk_norm, smol.rope_scaling_factor) == (False, False, 0.0)
    llama = ModelShape.from_hf_config(LLAMA32_1B)
    assert (llama.rope_theta, llama.rope_scaling_factor, llama.q_per_group) == (5e5, 32.0, 4)
    qwen2 = ModelShape.from_hf_config(QWEN25_05B)
    assert (qwen2.qkv_bias, qwen2.qk_norm, qwen2.head_dim) == (True, False, 64)
    qwen3 = ModelShape.from_hf_config(QWEN3_06B)
    assert (qwen3.qkv_bias, qwen3.qk_norm, qwen3.head_dim) == (False, True, 128)  # 1024 / 16 would be 64
    for shape in (smol, llama, qwen2, qwen3):
        assert convert.family(shape).name == shape.family


def test_transformers5_rope_parameters_layout_gives_the_same_shape() -> None:
    params = {"rope_theta": 500000.0, **LLAMA32_1B["rope_scaling"]}
    v5 = {k: v for k, v in LLAMA32_1B.items() if k not in ("rope_theta", "rope_scaling")}
    assert ModelShape.from_hf_config(_with(v5, rope_parameters=params)) == ModelShape.from_hf_config(LLAMA32_1B)
    default = ModelShape.from_hf_config(_with(v5, rope_parameters={"rope_type": "default", "rope_theta": 7.0}))
    assert (default.rope_theta, default.rope_scaling_factor) == (7.0, 0.0)


def test_qwen3_megatron_names_hold_qk_norms() -> None:
    shape = ModelShape.from_hf_config(_with(QWEN3_06B, num_hidden_layers=1))
    names = convert.family(shape).megatron_names(shape)
    assert "decoder.layers.0.self_attention.q_layernorm.weight" in names
    assert "decoder.layers.0.self_attention.k_layernorm.weight" in names
    assert not any(n.endswith("linear_qkv.bias") for n in names)
    hf = convert.hf_names(shape)
    assert "model.layers.0.self_attn.q_norm.weight" in hf and "model.layers.0.self_attn.k_norm.weight" in hf
    assert "lm_head.weight" not in hf  # tied


@pytest.mark.parametrize(
    ("key", "value"),
    [("low_freq_factor", 2.0), ("high_freq_factor", 8.0), ("original_max_position_embeddings", 4096)],
)
def test_llama3_parameters_megatron_cannot_express_are_refused(key: str, value: float) -> None:
    scaling = {**LLAMA32_1B["rope_scaling"], key: value}
    with pytest.raises(ConversionError, match=rf"rope_scaling\.{key}={value} is not supported"):
        ModelShape.from_hf_config(_with(LLAMA32_1B, rope_scaling=scaling))
    v5 = {"rope_theta": 5e5, **scaling}
    with pytest.raises(ConversionError, match=rf"rope_parameters\.{key}"):
        ModelShape.from_hf_config(_with(LLAMA32_1B, rope_scaling=None, rope_parameters=v5))


def test_llama3_original_length_defaults_like_transformers() -> None:
    # without original_max_position_embeddings transformers uses max_position_embeddings
    scaling = {k: v for k, v in LLAMA32_1B["rope_scaling"].items() if k != "original_max_position_embeddings"}
    with pytest.raises(ConversionError, match="original_max_position_embeddings=131072"):
        ModelShape.from_hf_config(_with(LLAMA32_1B, rope_scaling=scaling))
    ok = _with(LLAMA32_1B, rope_scaling=scaling, max_position_embeddings=8192)
    assert ModelShape.from_hf_config(ok).rope_scaling_factor == 32.0


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope_scaling.rope_type 'linear'"),
        ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "rope_scaling.rope_type 'dynamic'"),
        ({"rope_scaling": {**LLAMA32_1B["rope_scaling"], "factor": 0.5}}, "rope_scaling.factor"),
        ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"mlp_bias": True}, "mlp_bias"),
        ({"layer_types": ["full_attention", "sliding_attention"]}, "layer_types"),
    ],
)
def test_unsupported_features_are_refused_naming_the_key(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ConversionError, match=message.replace(".", r"\.")):
        ModelShape.from_hf_config(_with(LLAMA32_1B, **change))


def test_family_checks() -> None:
    with pytest.raises(ConversionError, match="qwen3 with attention_bias"):
        convert.family(ModelShape.from_hf_config(_with(QWEN3_06B, attention_bias=True)))
    with pytest.raises(ConversionError, match="llama with attention_bias"):
        convert.family(ModelShape.from_hf_config(_with(SMOLLM2_135M, attention_bias=True)))
    with pytest.raises(ConversionError, match="use_sliding_window"):
        ModelShape.from_hf_config(_with(QWEN25_05B, use_sliding_window=True))
    with pytest.raises(ConversionError, match="no weight mapping for model_type 'qwen3_moe'"):
        convert.family(ModelShape.from_hf_config(_with(QWEN3_06B, model_type="qwen3_moe")))
    assert convert.families() == ["llama", "mixtral", "qwen2", "qwen3"]
