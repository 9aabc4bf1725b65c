"""Tiny random HuggingFace models for tests (Qwen2, Qwen3, Llama, Mixtral; Gemma, which only the hf
trainer engine runs), saved as safetensors dirs.

Used by tests/trainer, tests/convert and other tests that need a model directory without
downloads. Random init with a fixed seed, so two calls with the same arguments give the same
weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import transformers

_CONFIGS: dict[str, tuple[type[Any], type[Any]]] = {
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
    "mixtral": (transformers.MixtralConfig, transformers.MixtralForCausalLM),
    "gemma": (transformers.GemmaConfig, transformers.GemmaForCausalLM),
}


def make_tiny_hf_model(
    directory: str | Path,
    family: str = "qwen2",
    hidden: int = 64,
    layers: int = 2,
    vocab: int = 128,
    heads: int = 4,
    kv_heads: int = 2,
    ffn: int | None = None,
    tie: bool | None = None,
    seed: int = 0,
    **extra: Any,
) -> Path:
    """Write a randomly initialised causal LM with its config.json to ``directory``; return it.

    Defaults: tied embeddings for qwen2, untied for the others (so both paths are covered);
    ``head_dim`` is hidden // heads unless given in ``extra`` (qwen3's own default, 128, is not
    used). ``extra`` goes to the config as is (e.g. ``rope_parameters``).
    """
    config_cls, model_cls = _CONFIGS[family]
    options: dict[str, Any] = dict(
        hidden_size=hidden,
        intermediate_size=ffn or hidden * 3,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        vocab_size=vocab,
        max_position_embeddings=512,
        tie_word_embeddings=(family in ("qwen2", "gemma")) if tie is None else tie,
        rms_norm_eps=1e-6,
        torch_dtype="float32",
    )
    if family == "mixtral":
        options.update(num_local_experts=4, num_experts_per_tok=2)
    if family in ("qwen3", "gemma"):  # their own defaults (128, 256) are not hidden // heads
        options.update(head_dim=hidden // heads)
    options.update(extra)
    config = config_cls(**options)
    torch.manual_seed(seed)
    model = model_cls(config).to(torch.float32)
    with torch.no_grad():  # larger than the default init, so that tests see real differences
        for param in model.parameters():
            if param.dim() == 1:
                param.add_(torch.randn_like(param) * 0.1)
            else:
                param.normal_(0.0, 0.08)
    out = Path(directory)
    model.save_pretrained(out, safe_serialization=True)
    return out


def make_family_dirs(root: Path, families: list[str]) -> dict[str, Path]:
    """One tiny model per family under `root` (module-scoped fixtures of the engine tests)."""
    return {family: make_tiny_hf_model(root / family, family=family) for family in families}


def grouped_samples(seed: int) -> list[Any]:
    """Three groups of 2-4 completions (1-6 tokens, ids < 128) sharing prompts of 6-12 tokens, as the RL
    loop packs them (a group of one-token prompts is not worth testing: it is never shared)."""
    from tandem.sidecars.algorithms.algorithm_interface import Sample

    gen = torch.Generator().manual_seed(seed)
    out: list[Any] = []
    for g, size in enumerate((4, 2, 3)):
        prompt = torch.randint(1, 128, (int(torch.randint(6, 13, (1,), generator=gen)),), generator=gen).tolist()
        for k in range(size):
            n = int(torch.randint(1, 7, (1,), generator=gen))
            out.append(Sample(prompt, torch.randint(1, 128, (n,), generator=gen).tolist(), group=g,
                              reward=float((g + k) % 3), rollout_logprobs=[-1.5] * n))
    return out
