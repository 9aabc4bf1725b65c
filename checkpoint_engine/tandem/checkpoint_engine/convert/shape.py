"""Model shape read from a HuggingFace ``config.json``: what every weight mapping needs to know.

Built by the trainer (``MegatronEngine.from_hf``) and by the rollout side from the same config
file; passed to every function of :mod:`tandem.checkpoint_engine.convert`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any


class ConversionError(ValueError):
    """A weight or config cannot be mapped between Megatron and HuggingFace layouts."""


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
    qkv_bias: bool
    rms_eps: float  # rms_norm_eps
    rope_theta: float  # rope_theta or rope_parameters.rope_theta
    max_positions: int  # max_position_embeddings
    num_experts: int = 0  # num_local_experts (0: dense MLP)
    moe_top_k: int = 0  # num_experts_per_tok
    padded_vocab: int = 0  # Megatron's padded embedding rows (0: same as vocab)

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
            rope = config.get("rope_theta")
            if rope is None:
                rope = (config.get("rope_parameters") or {}).get("rope_theta", 10000.0)
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
                rope_theta=float(rope),
                max_positions=int(config.get("max_position_embeddings", 4096)),
                num_experts=int(config.get("num_local_experts", 0) or 0),
                moe_top_k=int(config.get("num_experts_per_tok", 0) or 0),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ConversionError(f"config.json is missing or has a bad field: {exc}") from exc
        scaling = config.get("rope_scaling") or config.get("rope_parameters") or {}
        if scaling.get("rope_type", scaling.get("type", "default")) != "default":
            raise ConversionError(
                f"rope_type {scaling.get('rope_type', scaling.get('type'))!r} is not supported"
            )
        if config.get("use_sliding_window"):
            raise ConversionError("use_sliding_window=true is not supported")
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
