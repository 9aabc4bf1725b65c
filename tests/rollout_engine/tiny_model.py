"""Builds the tiny Qwen2 model and tokenizer the rollout engine's tests share (no downloads).

Callers: tests/rollout_engine/conftest.py (session fixtures) and the tests that need fresh
random weights of the same architecture (`random_state_dict`).
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

VOCAB = 1024
WORDS = (
    "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho "
    "sigma tau upsilon phi chi psi omega one two three four five six seven eight nine ten"
).split()


def build_tokenizer(out: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    corpus = [" ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(12)) + f" {i} {i * 13 % 97}" for i in range(400)]
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB - 16,
        special_tokens=["<unk>", "<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus, trainer)
    from tokenizers import decoders

    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", unk_token="<unk>", pad_token="<|endoftext|>"
    )
    fast.save_pretrained(out)


def config(hidden: int = 128, layers: int = 2, heads: int = 2, kv_heads: int = 1, tied: bool = False):  # type: ignore[no-untyped-def]
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=1024,
        tie_word_embeddings=tied,
        torch_dtype="float32",
        eos_token_id=1,
        bos_token_id=1,
    )


def random_model(seed: int, tied: bool = False):  # type: ignore[no-untyped-def]
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config(tied=tied)).eval()
    with torch.no_grad():  # larger weights than the default init: greedy outputs differ per seed
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.2)
    return model


def random_state_dict(seed: int) -> dict[str, torch.Tensor]:
    return {k: v.contiguous() for k, v in random_model(seed).state_dict().items()}


def save_model(out: Path, seed: int, tied: bool = False) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    random_model(seed, tied=tied).save_pretrained(out)
    build_tokenizer(out)
    return out


def save_vlm(root: Path, seed: int = 3, tied: bool = False) -> Path:
    """The VLM demo's LLaVA (tandem.sidecars.vlm_demo.build) on this tiny Qwen2, under root/llava."""
    from tandem.sidecars.vlm_demo import build

    return build.build_llava(save_model(root / "lm", seed=seed, tied=tied), root / "llava", seed=0)


def random_adapters(model: torch.nn.Module, seed: int) -> dict[str, torch.Tensor]:
    """Draw every LoRA adapter of a PeftModel at random (x0.3, so that they change its outputs; PEFT starts B at
    zero), put it in eval mode, and return the adapters under the names PEFT saves them with."""
    from tandem.sidecars.trainer.engines import lora

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if lora.is_adapter(name):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    model.eval()
    return {lora.saved_name(n): p.detach().clone() for n, p in model.named_parameters() if lora.is_adapter(n)}
