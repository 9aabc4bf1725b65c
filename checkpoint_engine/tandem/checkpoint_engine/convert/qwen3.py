"""Qwen3 family (``model_type: qwen3``): the dense decoder mapping plus per-head q/k RMSNorm.

Registered in :mod:`tandem.checkpoint_engine.convert`; built on the Megatron side by
``megatron_build`` with ``qk_layernorm=True`` (``self_attention.{q,k}_layernorm``). Qwen3 has no
q/k/v biases; its ``head_dim`` is a config field and may differ from ``hidden_size / heads``
(Megatron's ``kv_channels``).
"""

from __future__ import annotations

from tandem.checkpoint_engine.convert.dense import DenseDecoder
from tandem.checkpoint_engine.convert.shape import ConversionError, ModelShape


class Qwen3(DenseDecoder):
    name = "qwen3"

    def check(self, shape: ModelShape) -> None:
        if shape.num_experts:
            raise ConversionError("family qwen3 has no mixture-of-experts mapping (qwen3_moe is another family)")
        if not shape.qk_norm:
            raise ConversionError("qwen3 mapping expects q/k norms")
        if shape.qkv_bias:
            # attention_bias also adds an o_proj bias, which Megatron's qkv-only bias cannot hold.
            raise ConversionError("qwen3 with attention_bias=true is not supported")


FAMILY = Qwen3()
