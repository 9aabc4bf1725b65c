"""Qwen2 family (``model_type: qwen2``): the dense decoder mapping plus q/k/v biases.

Registered in :mod:`tandem.checkpoint_engine.convert`. Qwen2 always has biases on q, k and v
(Megatron's ``add_qkv_bias``) and none on o_proj or the MLP.
"""

from __future__ import annotations

from tandem.checkpoint_engine.convert.dense import DenseDecoder
from tandem.checkpoint_engine.convert.shape import ConversionError, ModelShape


class Qwen2(DenseDecoder):
    name = "qwen2"

    def check(self, shape: ModelShape) -> None:
        super().check(shape)
        if not shape.qkv_bias:
            raise ConversionError("qwen2 mapping expects q/k/v biases")


FAMILY = Qwen2()
