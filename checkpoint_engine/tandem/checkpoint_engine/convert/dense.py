"""Weight mapping shared by the dense decoder families (Llama, Qwen2, Qwen3): Megatron GPTModel <-> HF.

Used by the family modules (:mod:`.llama`, :mod:`.qwen2`, :mod:`.qwen3`), which only add their own
config checks; MoE families (:mod:`.mixtral`) extend it with the expert weights. Every function here
is a pure tensor function on *full* Megatron tensors (tensor-parallel shards already merged by
:mod:`.tp`) with *global* layer numbers. Megatron's fused tensors:

* ``linear_qkv`` is ``[groups, (q_per_group + 2) * head_dim, hidden]``: per query group its query
  heads, then one key head, then one value head (same for the bias, without ``hidden``);
* ``linear_fc1`` is ``[gate; up]`` along dim 0.

With ``shape.qk_norm`` (Qwen3) each layer also has per-head RMSNorm weights ``[head_dim]`` on the
queries and keys: Megatron's ``self_attention.{q,k}_layernorm`` are HF's ``self_attn.{q,k}_norm``.

No RoPE permutation is needed: Megatron's non-interleaved rotary embedding equals HF's.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import torch

from tandem.checkpoint_engine.convert.shape import ConversionError, ModelShape

LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")

# Megatron per-layer suffix -> HF per-layer suffix, for one-to-one tensors.
_LAYER_SIMPLE = {
    "input_layernorm.weight": "input_layernorm.weight",
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
    "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
    "self_attention.q_layernorm.weight": "self_attn.q_norm.weight",
    "self_attention.k_layernorm.weight": "self_attn.k_norm.weight",
}
_GLOBAL_SIMPLE = {"decoder.final_layernorm.weight": "model.norm.weight"}
_VOCAB = {
    "embedding.word_embeddings.weight": "model.embed_tokens.weight",
    "output_layer.weight": "lm_head.weight",
}

# How a vLLM rollout with tensor parallelism shards each HF tensor (see tp.rollout_slice).
COLUMN, ROW, REPLICATED, VOCAB, QUERY, KEY_VALUE = "column", "row", "replicated", "vocab", "query", "kv"


class DenseDecoder:
    """Mapping of a Llama-style decoder: RMSNorm, SwiGLU MLP, RoPE, grouped-query attention."""

    name = "dense"

    def check(self, shape: ModelShape) -> None:
        """Raise ConversionError when the config uses a feature this mapping does not cover."""
        if shape.num_experts:
            raise ConversionError(f"family {self.name} has no mixture-of-experts mapping")
        if shape.qk_norm:
            raise ConversionError(f"family {self.name} has no q/k norm mapping")

    # ----- names -----
    def layer_names(self, shape: ModelShape) -> list[str]:
        names = ["input_layernorm.weight", "self_attention.linear_qkv.weight"]
        if shape.qkv_bias:
            names.append("self_attention.linear_qkv.bias")
        if shape.qk_norm:
            names += ["self_attention.q_layernorm.weight", "self_attention.k_layernorm.weight"]
        names += ["self_attention.linear_proj.weight", "pre_mlp_layernorm.weight"]
        return names + self.mlp_names(shape)

    def mlp_names(self, shape: ModelShape) -> list[str]:
        return ["mlp.linear_fc1.weight", "mlp.linear_fc2.weight"]

    def megatron_names(self, shape: ModelShape) -> list[str]:
        names = ["embedding.word_embeddings.weight"]
        for i in range(shape.num_layers):
            names += [f"decoder.layers.{i}.{suffix}" for suffix in self.layer_names(shape)]
        names.append("decoder.final_layernorm.weight")
        if not shape.tie_embeddings:
            names.append("output_layer.weight")
        return names

    # ----- Megatron -> HF -----
    def to_hf(self, name: str, tensor: torch.Tensor, shape: ModelShape) -> list[tuple[str, torch.Tensor]]:
        if name in _VOCAB:
            if name == "output_layer.weight" and shape.tie_embeddings:
                return []
            return [(_VOCAB[name], tensor[: shape.vocab])]
        if name in _GLOBAL_SIMPLE:
            return [(_GLOBAL_SIMPLE[name], tensor)]
        match = LAYER.match(name)
        if match is None:
            raise ConversionError(f"no HF name for Megatron tensor {name!r}")
        layer, suffix = int(match.group(1)), match.group(2)
        prefix = f"model.layers.{layer}."
        if suffix in _LAYER_SIMPLE:
            return [(prefix + _LAYER_SIMPLE[suffix], tensor)]
        if suffix.startswith("self_attention.linear_qkv."):
            kind = suffix.rsplit(".", 1)[1]
            q, k, v = split_qkv(tensor, shape)
            return [(f"{prefix}self_attn.{p}_proj.{kind}", t) for p, t in zip("qkv", (q, k, v), strict=True)]
        return [(prefix + hf, t) for hf, t in self.mlp_to_hf(suffix, tensor, shape)]

    def mlp_to_hf(
        self, suffix: str, tensor: torch.Tensor, shape: ModelShape
    ) -> list[tuple[str, torch.Tensor]]:
        if suffix == "mlp.linear_fc1.weight":
            gate, up = tensor.chunk(2, dim=0)
            return [("mlp.gate_proj.weight", gate), ("mlp.up_proj.weight", up)]
        if suffix == "mlp.linear_fc2.weight":
            return [("mlp.down_proj.weight", tensor)]
        raise ConversionError(f"no HF name for Megatron layer tensor {suffix!r}")

    # ----- HF -> Megatron -----
    def hf_sources(self, name: str, shape: ModelShape) -> list[str]:
        """HF tensor names that together make the Megatron tensor ``name``."""
        if name in _VOCAB:
            if name == "output_layer.weight" and shape.tie_embeddings:
                return [_VOCAB["embedding.word_embeddings.weight"]]
            return [_VOCAB[name]]
        if name in _GLOBAL_SIMPLE:
            return [_GLOBAL_SIMPLE[name]]
        match = LAYER.match(name)
        if match is None:
            raise ConversionError(f"no HF source for Megatron tensor {name!r}")
        prefix, suffix = f"model.layers.{match.group(1)}.", match.group(2)
        if suffix in _LAYER_SIMPLE:
            return [prefix + _LAYER_SIMPLE[suffix]]
        if suffix.startswith("self_attention.linear_qkv."):
            kind = suffix.rsplit(".", 1)[1]
            return [f"{prefix}self_attn.{p}_proj.{kind}" for p in "qkv"]
        return [prefix + hf for hf in self.mlp_sources(suffix)]

    def mlp_sources(self, suffix: str) -> list[str]:
        if suffix == "mlp.linear_fc1.weight":
            return ["mlp.gate_proj.weight", "mlp.up_proj.weight"]
        if suffix == "mlp.linear_fc2.weight":
            return ["mlp.down_proj.weight"]
        raise ConversionError(f"no HF source for Megatron layer tensor {suffix!r}")

    def from_hf(self, name: str, sources: Sequence[torch.Tensor], shape: ModelShape) -> torch.Tensor:
        """Build the full Megatron tensor ``name`` from the tensors named by :meth:`hf_sources`."""
        if name in _VOCAB:
            weight = sources[0]
            pad = shape.megatron_vocab - weight.shape[0]
            return torch.cat([weight, weight.new_zeros(pad, weight.shape[1])]) if pad > 0 else weight
        if ".linear_qkv." in name:
            return merge_qkv(sources[0], sources[1], sources[2], shape)
        if len(sources) == 2:  # gate, up
            return torch.cat(list(sources), dim=0)
        return sources[0]

    # ----- rollout tensor parallelism -----
    def rollout_split(self, hf_name: str) -> str:
        """How vLLM's parallel layers shard ``hf_name`` (one of the module constants)."""
        if hf_name.endswith(("embed_tokens.weight", "lm_head.weight")):
            return VOCAB
        if ".q_proj." in hf_name:
            return QUERY
        if ".k_proj." in hf_name or ".v_proj." in hf_name:
            return KEY_VALUE
        if hf_name.endswith(("o_proj.weight", "down_proj.weight", ".w2.weight")):
            return ROW
        if hf_name.endswith(("gate_proj.weight", "up_proj.weight", ".w1.weight", ".w3.weight")):
            return COLUMN
        return REPLICATED


def split_qkv(tensor: torch.Tensor, shape: ModelShape) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split Megatron's grouped ``linear_qkv`` weight or bias into HF q, k, v."""
    groups, qpg, hd = shape.num_kv_heads, shape.q_per_group, shape.head_dim
    rest = tensor.shape[1:]
    if tensor.shape[0] != groups * (qpg + 2) * hd:
        raise ConversionError(f"linear_qkv has {tensor.shape[0]} rows, expected {groups * (qpg + 2) * hd}")
    grouped = tensor.reshape(groups, (qpg + 2) * hd, *rest)
    q = grouped[:, : qpg * hd].reshape(-1, *rest)
    k = grouped[:, qpg * hd : (qpg + 1) * hd].reshape(-1, *rest)
    v = grouped[:, (qpg + 1) * hd :].reshape(-1, *rest)
    return q, k, v


def merge_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, shape: ModelShape) -> torch.Tensor:
    """Inverse of :func:`split_qkv`."""
    groups, qpg, hd = shape.num_kv_heads, shape.q_per_group, shape.head_dim
    rest = q.shape[1:]
    parts = [q.reshape(groups, qpg * hd, *rest), k.reshape(groups, hd, *rest), v.reshape(groups, hd, *rest)]
    return torch.cat(parts, dim=1).reshape(-1, *rest)
