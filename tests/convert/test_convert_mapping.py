"""Pure Megatron <-> HF mapping (tandem.checkpoint_engine.convert): no megatron, no processes.

Hand-built tensors check the fused layouts (grouped QKV, gate/up per TP shard) and the vLLM
rollout slices; tiny HF checkpoints of each family check that HF -> Megatron -> HF is exact.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tandem.checkpoint_engine import convert
from tandem.checkpoint_engine.convert import ConversionError, ModelShape

sys.path.insert(0, str(Path(__file__).parents[1] / "trainer"))
from tiny_models import make_tiny_hf_model  # noqa: E402


def _shape(**kw: object) -> ModelShape:
    config: dict[str, object] = dict(
        model_type="llama",
        num_hidden_layers=1,
        hidden_size=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=1,
        intermediate_size=4,
        vocab_size=100,
    )
    config.update(kw)
    return ModelShape.from_hf_config(config)


def test_grouped_qkv_split_by_hand() -> None:
    # 4 query heads in 2 groups, head_dim 1: rows are q0 q1 k0 v0 | q2 q3 k1 v1
    shape = _shape()
    qkv = torch.tensor([[10.0], [11.0], [20.0], [30.0], [12.0], [13.0], [21.0], [31.0]])
    out = dict(convert.family(shape).to_hf("decoder.layers.0.self_attention.linear_qkv.weight", qkv, shape))
    assert out["model.layers.0.self_attn.q_proj.weight"].flatten().tolist() == [10, 11, 12, 13]
    assert out["model.layers.0.self_attn.k_proj.weight"].flatten().tolist() == [20, 21]
    assert out["model.layers.0.self_attn.v_proj.weight"].flatten().tolist() == [30, 31]
    sources = [out[f"model.layers.0.self_attn.{p}_proj.weight"] for p in "qkv"]
    assert torch.equal(
        convert.family(shape).from_hf("decoder.layers.0.self_attention.linear_qkv.weight", sources, shape),
        qkv,
    )


def test_gate_up_shards_merge_by_hand() -> None:
    # TP=2 shards of linear_fc1 are [gate_r; up_r]; the full tensor is [gate_0; gate_1; up_0; up_1]
    shards = [torch.tensor([[1.0], [5.0]]), torch.tensor([[2.0], [6.0]])]
    full = convert.merge_tp("decoder.layers.3.mlp.linear_fc1.weight", shards)
    assert full.flatten().tolist() == [1, 2, 5, 6]
    for rank in range(2):
        assert torch.equal(
            convert.split_tp("decoder.layers.3.mlp.linear_fc1.weight", full, 2, rank), shards[rank]
        )


@pytest.mark.parametrize(
    ("name", "dim"),
    [
        ("decoder.layers.0.self_attention.linear_proj.weight", 1),
        ("decoder.layers.0.mlp.linear_fc2.weight", 1),
        ("decoder.layers.0.self_attention.linear_qkv.weight", 0),
        ("decoder.layers.0.self_attention.linear_qkv.bias", 0),
        ("embedding.word_embeddings.weight", 0),
        ("output_layer.weight", 0),
        ("decoder.layers.0.input_layernorm.weight", None),
        ("decoder.final_layernorm.weight", None),
        ("decoder.layers.0.mlp.router.weight", None),
    ],
)
@pytest.mark.parametrize("tp", [2, 4])
def test_split_merge_round_trip(name: str, dim: int | None, tp: int) -> None:
    full = torch.randn(8, 8) if not name.endswith(("bias", "layernorm.weight")) else torch.randn(8)
    shards = [convert.split_tp(name, full, tp, r) for r in range(tp)]
    if dim is None:
        assert all(torch.equal(s, full) for s in shards)
    else:
        assert all(s.shape[dim] == full.shape[dim] // tp for s in shards)
    assert torch.equal(convert.merge_tp(name, shards), full)


def test_rollout_slices_replicate_kv_heads_when_fewer_than_tp() -> None:
    shape = _shape(num_attention_heads=8, num_key_value_heads=2, hidden_size=8)  # head_dim 1
    k = torch.tensor([[0.0], [1.0]])
    got = [
        convert.rollout_slice("kv", "model.layers.0.self_attn.k_proj.weight", k, shape, 4, r)
        for r in range(4)
    ]
    assert [t.flatten().tolist() for t in got] == [[0], [0], [1], [1]]


def test_rollout_vocab_slices_follow_vllm_padding() -> None:
    shape = _shape(vocab_size=100)  # vLLM pads to 128: 64 rows per rank, the last rank gets 36
    emb = torch.arange(100.0)[:, None]
    parts = dict(convert.slice_for_rollout(shape, [("model.embed_tokens.weight", emb)], 2, 0))
    assert parts["model.embed_tokens.weight"].shape[0] == 64
    last = dict(convert.slice_for_rollout(shape, [("model.embed_tokens.weight", emb)], 2, 1))
    assert last["model.embed_tokens.weight"].flatten().tolist() == list(range(64, 100))


def test_padded_megatron_vocab_is_trimmed_on_export() -> None:
    shape = _shape(vocab_size=10).with_padded_vocab(4)
    assert shape.megatron_vocab == 12
    emb = torch.randn(10, 4)
    meg = dict(
        convert.from_hf(shape, {"model.embed_tokens.weight": emb}, names=["embedding.word_embeddings.weight"])
    )
    assert meg["embedding.word_embeddings.weight"].shape == (12, 4)
    assert not meg["embedding.word_embeddings.weight"][10:].any()
    back = dict(convert.to_hf(shape, meg.items()))
    assert torch.equal(back["model.embed_tokens.weight"], emb)


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "llama", "mixtral"])
def test_hf_megatron_hf_is_exact(family: str, tmp_path: Path) -> None:
    extra = {"head_dim": 32} if family == "qwen3" else {}  # qwen3: head_dim != hidden / heads
    model_dir = make_tiny_hf_model(tmp_path / family, family=family, **extra)
    shape = ModelShape.from_hf_dir(model_dir)
    hf = load_file(str(model_dir / "model.safetensors"))
    megatron = list(convert.from_hf(shape, hf))
    assert len({n for n, _ in megatron}) == len(megatron)
    back = dict(convert.to_hf(shape, megatron))
    assert sorted(back) == sorted(hf) == sorted(convert.hf_names(shape))
    for name, tensor in hf.items():
        assert torch.equal(back[name], tensor), name


def test_errors_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(ConversionError, match="gpt2"):
        convert.family(_shape(model_type="gpt2"))
    with pytest.raises(ConversionError, match="attention_bias"):
        convert.family(_shape(attention_bias=True))
    with pytest.raises(ConversionError, match="low_freq_factor is missing for rope_type llama3"):
        _shape(rope_parameters={"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0})
    with pytest.raises(ConversionError, match="rope_type 'yarn'"):
        _shape(rope_parameters={"rope_type": "yarn", "rope_theta": 5e5, "factor": 4.0})
    with pytest.raises(ConversionError, match="qwen3 with attention_bias"):
        convert.family(_shape(model_type="qwen3", attention_bias=True))
    with pytest.raises(ConversionError, match="q/k norm"):
        convert.family(dataclasses.replace(_shape(), qk_norm=True))
    with pytest.raises(ConversionError, match="sliding"):
        _shape(model_type="qwen2", use_sliding_window=True)
    with pytest.raises(ConversionError, match="num_key_value_heads"):
        _shape(num_key_value_heads=3)
    with pytest.raises(ConversionError, match="hidden_size"):
        ModelShape.from_hf_config({"model_type": "llama", "num_attention_heads": 2})
    with pytest.raises(ConversionError, match="q_proj"):
        list(convert.from_hf(_shape(), {}, names=["decoder.layers.0.self_attention.linear_qkv.weight"]))
    with pytest.raises(ConversionError, match="no HF name"):
        list(convert.to_hf(_shape(), [("decoder.layers.0.bogus.weight", torch.zeros(1))]))
    with pytest.raises(ConversionError, match="config.json"):
        ModelShape.from_hf_dir(tmp_path)
