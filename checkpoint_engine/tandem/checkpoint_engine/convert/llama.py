"""Llama family (``model_type: llama``): the dense decoder mapping with Llama's config checks.

Registered in :mod:`tandem.checkpoint_engine.convert`.
"""

from __future__ import annotations

from tandem.checkpoint_engine.convert.dense import DenseDecoder
from tandem.checkpoint_engine.convert.shape import ConversionError, ModelShape


class Llama(DenseDecoder):
    name = "llama"

    def check(self, shape: ModelShape) -> None:
        super().check(shape)
        if shape.qkv_bias:
            # attention_bias also adds an o_proj bias, which Megatron's qkv-only bias cannot hold.
            raise ConversionError("llama with attention_bias=true is not supported")


FAMILY = Llama()
