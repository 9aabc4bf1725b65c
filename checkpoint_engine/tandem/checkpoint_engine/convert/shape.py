"""Model shape read from a HuggingFace ``config.json``: what every weight mapping needs to know.

Built by the trainer (``MegatronEngine.from_hf``) and by the rollout side from the same config
file; passed to every function of :mod:`tandem.checkpoint_engine.convert`. Config features that
Megatron (megatron-core 0.16, as built by ``megatron_build``) cannot reproduce exactly are refused
here with a :class:`ConversionError` naming the config key, rather than trained on silently wrong.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any


class ConversionError(ValueError):
    """A weight or config cannot be mapped between Megatron and HuggingFace layouts."""


# megatron-core 0.16's llama3 RoPE scaling (RotaryEmbedding._apply_scaling) takes only `factor`
# from GPTModel; these three keep their defaults, so configs must use exactly these values.
LLAMA3_FIXED = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """Architecture numbers of a decoder-only transformer (HF names in comments)."""

    family: str  # model_type
    num_layers: int  # num_hidden_layers
    hidden: int  # hidden_size
    num_heads: int  # num_attention_heads
    num_kv_heads: int  # num_key_value_heads
    head_dim: int  # head_dim (default hidden // heads)
    ffn_hidden: int  # intermediate_size
    vocab: int  # vocab_size
    tie_embeddings: bool  # tie_word_embeddings
    qkv_bias: bool  # qwen2 always; attention_bias otherwise
    rms_eps: float  # rms_norm_eps
    rope_theta: float  # rope_theta or rope_parameters.rope_theta
    max_positions: int  # max_position_embeddings
    num_experts: int = 0  # num_local_experts (0: dense MLP)
    moe_top_k: int = 0  # num_experts_per_tok
    padded_vocab: int = 0  # Megatron's padded embedding rows (0: same as vocab)
    qk_norm: bool = False  # per-head RMSNorm on queries and keys (qwen3: q_norm / k_norm)
    rope_scaling_factor: float = 0.0  # rope_type llama3: its factor (0: no scaling)

    @property
    def megatron_vocab(self) -> int:
        return self.padded_vocab or self.vocab

    @property
    def q_per_group(self) -> int:
        return self.num_heads // self.num_kv_heads

    def with_padded_vocab(self, multiple: int) -> ModelShape:
        padded = -(-self.vocab // multiple) * multiple
        return dataclasses.replace(self, padded_vocab=padded)

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any]) -> ModelShape:
        try:
            family = str(config["model_type"])
            heads = int(config["num_attention_heads"])
            hidden = int(config["hidden_size"])
            max_positions = int(config.get("max_position_embeddings", 4096))
            theta, scaling = _rope(config, max_positions)
            shape = cls(
                family=family,
                num_layers=int(config["num_hidden_layers"]),
                hidden=hidden,
                num_heads=heads,
                num_kv_heads=int(config.get("num_key_value_heads") or heads),
                head_dim=int(config.get("head_dim") or hidden // heads),
                ffn_hidden=int(config["intermediate_size"]),
                vocab=int(config["vocab_size"]),
                tie_embeddings=bool(config.get("tie_word_embeddings", False)),
                qkv_bias=family == "qwen2" or bool(config.get("attention_bias", False)),
                rms_eps=float(config.get("rms_norm_eps", 1e-6)),
                rope_theta=theta,
                max_positions=max_positions,
                num_experts=int(config.get("num_local_experts", 0) or 0),
                moe_top_k=int(config.get("num_experts_per_tok", 0) or 0),
                qk_norm=family == "qwen3",
                rope_scaling_factor=scaling,
            )
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, ConversionError):
                raise
            raise ConversionError(f"config.json is missing or has a bad field: {exc}") from exc
        _check_features(config)
        if heads % shape.num_kv_heads:
            raise ConversionError(
                f"num_attention_heads={heads} is not a multiple of num_key_value_heads={shape.num_kv_heads}"
            )
        return shape

    @classmethod
    def from_hf_dir(cls, model_dir: str | Path) -> ModelShape:
        path = Path(model_dir) / "config.json"
        try:
            config = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ConversionError(f"cannot read {path}: {exc}") from exc
        return cls.from_hf_config(config)


def _rope(config: Mapping[str, Any], max_positions: int) -> tuple[float, float]:
    """``(rope_theta, llama3 factor or 0)`` from either config layout.

    transformers 4.x writes ``rope_theta`` and ``rope_scaling`` at the top level; 5.x writes one
    ``rope_parameters`` dict holding ``rope_theta`` and the scaling keys.
    """
    key = "rope_scaling" if config.get("rope_scaling") else "rope_parameters"
    params = config.get(key) or {}
    if not isinstance(params, Mapping):
        raise ConversionError(f"{key} must be a mapping, got {params!r}")
    if "rope_type" not in params and "type" not in params and any(isinstance(v, Mapping) for v in params.values()):
        raise ConversionError(f"{key} per layer type ({sorted(params)}) is not supported")
    theta = params.get("rope_theta", config.get("rope_theta"))  # transformers: the dict's value wins
    if theta is None:
        theta = 10000.0
    partial = params.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0))
    if partial is not None and float(partial) != 1.0:
        raise ConversionError(f"partial_rotary_factor={partial} is not supported (only 1.0)")
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default":
        return float(theta), 0.0
    if rope_type != "llama3":
        raise ConversionError(f"{key}.rope_type {rope_type!r} is not supported (default, llama3)")
    factor = params.get("factor")
    if not isinstance(factor, int | float) or isinstance(factor, bool) or factor < 1.0:
        raise ConversionError(f"{key}.factor must be a number >= 1 for rope_type llama3, got {factor!r}")
    given = {k: params[k] for k in LLAMA3_FIXED if k in params}
    # as transformers: a top-level original_max_position_embeddings wins, max_position_embeddings is the fallback
    original = config.get("original_max_position_embeddings", given.get("original_max_position_embeddings"))
    given["original_max_position_embeddings"] = max_positions if original is None else original
    for name, fixed in LLAMA3_FIXED.items():
        if name not in given:
            raise ConversionError(f"{key}.{name} is missing for rope_type llama3")
        if float(given[name]) != fixed:
            raise ConversionError(
                f"{key}.{name}={given[name]} is not supported: megatron-core's llama3 RoPE scaling "
                f"fixes it at {fixed:g}"
            )
    return float(theta), float(factor)


def _check_features(config: Mapping[str, Any]) -> None:
    """Refuse config features no family's Megatron model reproduces (the key named)."""
    if config.get("use_sliding_window"):
        raise ConversionError("use_sliding_window=true is not supported")
    layer_types = config.get("layer_types") or []
    if any(t != "full_attention" for t in layer_types):
        raise ConversionError(f"layer_types other than full_attention are not supported: {sorted(set(layer_types))}")
    if config.get("hidden_act", "silu") != "silu":
        raise ConversionError(f"hidden_act={config.get('hidden_act')!r} is not supported (only silu)")
    if config.get("mlp_bias"):
        raise ConversionError("mlp_bias=true is not supported")
