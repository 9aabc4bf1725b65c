"""Consecutive weight versions from real training steps, for the delta-update tests.

Callers: tests/transport/test_delta.py. A small Qwen2 (transformers, random init, seeded) takes
AdamW steps on a patterned token stream with fp32 master weights; each step's weights are one
version, cast to the published dtype (bf16 as Megatron publishes, or fp32).
"""

from __future__ import annotations

import torch

VOCAB = 512


def trained_versions(
    steps: int = 2, lr: float = 1e-5, dtype: torch.dtype = torch.bfloat16, seed: int = 0
) -> list[list[tuple[str, torch.Tensor]]]:
    """`steps + 1` versions: the initial weights, then the weights after each step."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    model = Qwen2ForCausalLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    rows = torch.arange(64)
    versions = [_snapshot(model, dtype)]
    for step in range(steps):
        starts = torch.arange(8).unsqueeze(1) * 3 + step
        ids = (starts * 7 + rows * (starts % 5 + 1)) % VOCAB  # learnable arithmetic patterns
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        versions.append(_snapshot(model, dtype))
    return versions


def _snapshot(model: torch.nn.Module, dtype: torch.dtype) -> list[tuple[str, torch.Tensor]]:
    return [(k, v.detach().to(dtype).clone()) for k, v in model.state_dict().items()]
