"""Mixtral family (``model_type: mixtral``): dense attention plus a mixture-of-experts MLP.

Registered in :mod:`tandem.checkpoint_engine.convert`. Megatron names (local spec, SequentialMLP)
with *global* expert numbers — the trainer renumbers each expert-parallel rank's local experts
(``global = ep_rank * experts_per_rank + local``) and gathers them before calling this mapping:

* ``mlp.router.weight``                           -> ``block_sparse_moe.gate.weight``
* ``mlp.experts.local_experts.{e}.linear_fc1.weight`` -> ``block_sparse_moe.experts.{e}.w1`` (gate)
  and ``.w3`` (up)
* ``mlp.experts.local_experts.{e}.linear_fc2.weight`` -> ``block_sparse_moe.experts.{e}.w2``
"""

from __future__ import annotations

import re

import torch

from tandem.checkpoint_engine.convert.dense import DenseDecoder
from tandem.checkpoint_engine.convert.shape import ConversionError, ModelShape

_EXPERT = re.compile(r"^mlp\.experts\.local_experts\.(\d+)\.(linear_fc1|linear_fc2)\.weight$")


class Mixtral(DenseDecoder):
    name = "mixtral"

    def check(self, shape: ModelShape) -> None:
        if shape.num_experts < 1:
            raise ConversionError("mixtral mapping needs num_local_experts >= 1")
        if shape.qkv_bias:
            raise ConversionError("mixtral with attention biases is not supported")

    def mlp_names(self, shape: ModelShape) -> list[str]:
        names = ["mlp.router.weight"]
        for e in range(shape.num_experts):
            names += [
                f"mlp.experts.local_experts.{e}.linear_fc1.weight",
                f"mlp.experts.local_experts.{e}.linear_fc2.weight",
            ]
        return names

    def mlp_to_hf(
        self, suffix: str, tensor: torch.Tensor, shape: ModelShape
    ) -> list[tuple[str, torch.Tensor]]:
        if suffix == "mlp.router.weight":
            return [("block_sparse_moe.gate.weight", tensor)]
        match = _EXPERT.match(suffix)
        if match is None:
            raise ConversionError(f"no HF name for Megatron layer tensor {suffix!r}")
        prefix = f"block_sparse_moe.experts.{match.group(1)}."
        if match.group(2) == "linear_fc1":
            gate, up = tensor.chunk(2, dim=0)
            return [(prefix + "w1.weight", gate), (prefix + "w3.weight", up)]
        return [(prefix + "w2.weight", tensor)]

    def mlp_sources(self, suffix: str) -> list[str]:
        if suffix == "mlp.router.weight":
            return ["block_sparse_moe.gate.weight"]
        match = _EXPERT.match(suffix)
        if match is None:
            raise ConversionError(f"no HF source for Megatron layer tensor {suffix!r}")
        prefix = f"block_sparse_moe.experts.{match.group(1)}."
        if match.group(2) == "linear_fc1":
            return [prefix + "w1.weight", prefix + "w3.weight"]
        return [prefix + "w2.weight"]


FAMILY = Mixtral()
