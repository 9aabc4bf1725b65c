"""Builds the tiny Qwen2 model and tokenizer the rollout engine's tests share (no downloads).

Callers: tests/rollout_engine/conftest.py (session fixtures) and the tests that need fresh
random weights of the same architecture (`random_state_dict`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

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


QWEN_VL_SPECIALS = ("<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
                    "<|video_pad|>")
# ChatML with content parts: an image part becomes Qwen2.5-VL's placeholder, which the processor (and vLLM) expands
QWEN_VL_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}{% else %}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{% endif %}{% endfor %}{% endif %}{{ '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def save_qwen_vl(out: Path, seed: int = 0, tied: bool = False) -> Path:
    """A tiny Qwen2.5-VL (random weights drawn from `seed`): this module's tokenizer with Qwen2.5-VL's special
    tokens, a 2-layer language model with 3-D rotary positions, a 2-block vision tower (14-pixel patches, 2x2 merged:
    a 56x56 picture is 4 image tokens; pictures are resized to 4..16 merged patches), its processor beside it."""
    from transformers import AutoTokenizer, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2_5_VLProcessor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

    out.mkdir(parents=True, exist_ok=True)
    build_tokenizer(out)
    tok = AutoTokenizer.from_pretrained(out)
    tok.add_special_tokens({"additional_special_tokens": list(QWEN_VL_SPECIALS)})
    tok.chat_template = QWEN_VL_TEMPLATE
    ids = {s: int(tok.convert_tokens_to_ids(s)) for s in QWEN_VL_SPECIALS}
    text = {"vocab_size": VOCAB + 64, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
            "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 1024,
            "rope_parameters": {"rope_type": "default", "mrope_section": [8, 12, 12], "rope_theta": 1e6},
            "eos_token_id": 1, "bos_token_id": 1, "tie_word_embeddings": tied}
    vision = {"depth": 2, "hidden_size": 64, "intermediate_size": 128, "num_heads": 2, "patch_size": 14,
              "spatial_merge_size": 2, "temporal_patch_size": 2, "window_size": 56, "out_hidden_size": 128,
              "fullatt_block_indexes": [1]}
    config = Qwen2_5_VLConfig(text_config=text, vision_config=vision, image_token_id=ids["<|image_pad|>"],
                              video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
                              vision_end_token_id=ids["<|vision_end|>"], tie_word_embeddings=tied)
    torch.manual_seed(seed)
    model = Qwen2_5_VLForConditionalGeneration(config).eval()
    with torch.no_grad():  # larger weights than the default init: pictures and seeds change the outputs
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.05 if ".visual." in f".{name}" else 0.2)
    model.save_pretrained(out)
    pixels = {"min_pixels": 28 * 28 * 4, "max_pixels": 28 * 28 * 16}
    Qwen2_5_VLProcessor(image_processor=Qwen2VLImageProcessorPil(**pixels),
                        video_processor=Qwen2VLVideoProcessor(**pixels),
                        tokenizer=tok, chat_template=QWEN_VL_TEMPLATE).save_pretrained(out)
    tok.save_pretrained(out)
    return out


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


def end_turns(model_dir: Path, messages: list[dict[str, Any]], pictures: list[Any], share: float = 0.5) -> Path:
    """The tiny vision-language model at `model_dir` made to end its turns as a chat model does: its tokenizer's end
    of turn (eos) the chat template's `<|im_end|>`, which the random weights then sample at about `share` of the
    steps of a reply it samples to `messages` with each of `pictures` but the first (its head's row along the mean
    direction of the final hidden states there, less their part along the first step's, scaled by bisection).
    Without it the model never ends a turn, and a multi-turn trajectory never gets to its environment's answer.
    Rewritten in place; returns `model_dir`."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(model_dir)
    tok = processor.tokenizer
    tok.add_special_tokens({"eos_token": "<|im_end|>"})
    end = int(tok.convert_tokens_to_ids("<|im_end|>"))
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32).eval()
    first, later = [], []
    torch.manual_seed(0)
    for picture in pictures:  # replies as the weights sample them
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        inputs = processor(images=[picture], text=text, return_tensors="pt")
        with torch.no_grad():
            out = model.generate(**inputs, do_sample=True, max_new_tokens=8, min_new_tokens=8,
                                 output_hidden_states=True, return_dict_in_generate=True)
        states = [step[-1][0, -1] for step in out.hidden_states]  # the state each sampled token was drawn from
        first.append(states[0])
        later.extend(states[1:])
    opening, states = torch.stack(first).mean(0), torch.stack(later)
    opening = opening / opening.norm()
    direction = states.mean(0) - (states.mean(0) @ opening) * opening  # not at a turn's first token: no empty turns
    direction = direction / direction.norm()
    with torch.no_grad():
        head = model.get_output_embeddings().weight
        lo, hi = 0.0, 100.0
        for _ in range(40):
            head[end] = (lo + hi) / 2 * direction
            taken = torch.softmax(states @ head.T, -1)[:, end].mean().item()
            lo, hi = (lo, (lo + hi) / 2) if taken > share else ((lo + hi) / 2, hi)
    model.config.eos_token_id = end
    model.generation_config.eos_token_id = end
    model.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    return model_dir
