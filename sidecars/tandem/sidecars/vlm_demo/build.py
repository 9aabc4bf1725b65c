"""A small vision-language model built here: SmolLM2-135M-Instruct as the language model, in the LLaVA layout.

Role: no pretrained VLM can be fetched on these machines, so `build_llava(lm_dir, out, seed)` makes one
deterministically: a SigLIP vision tower (64x64 pictures, 16x16 patches: 16 image tokens, random at first),
LLaVA's two-layer MLP projector, and the language model's own weights, with an `<image>` token added to its
tokenizer (embeddings padded to a multiple of 64) and a chat template that renders OpenAI-style content parts
(an image part becomes `<image>`, which the processor expands to the picture's 16 tokens). The directory
holds what transformers' `AutoProcessor` / `LlavaForConditionalGeneration` and vLLM's LLaVA both load:
- transformers 5 keeps SigLIP's layers at the tower's root in memory and saves them so
  (`vision_tower.embeddings.*`); vLLM 0.32 looks for them under `vision_tower.vision_model.*`, the layout of
  every LLaVA checkpoint before transformers 5, which transformers 5 loads too: the weights are saved in that
  layout (`vision_names`, by the rule the rollout's loader renames versions with: `tower_names.vllm_name`);
- SigLIP's attention-pooling head, which LLaVA never uses, is left out (`vision_use_head: false`).
Then warmup.py aligns the tower and projector with the language model. Callers: warmup.py, `tandem models`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from tandem.checkpoint_engine.versions.tower_names import vllm_name

IMAGE_TOKEN = "<image>"
IMAGE_SIZE, PATCH = 64, 16
IMAGE_TOKENS = (IMAGE_SIZE // PATCH) ** 2
VOCAB_MULTIPLE = 64
VISION = {"hidden_size": 192, "intermediate_size": 768, "num_hidden_layers": 4, "num_attention_heads": 4,
          "image_size": IMAGE_SIZE, "patch_size": PATCH, "num_channels": 3, "vision_use_head": False}
# SmolLM2's ChatML template, with a message's content either text or a list of parts (text, or an image)
TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
    "{% endif %}{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}{% else %}{{ '" + IMAGE_TOKEN + "' }}{% endif %}"
    "{% endfor %}{% endif %}{{ '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def vision_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers 5's saved names of the LLaVA's SigLIP tower (`vision_tower.X`) in the layout vLLM loads and
    transformers loads too (`vision_tower.vision_model.X`: `tower_names.vllm_name`); other names unchanged."""
    return {vllm_name(name, "siglip_vision_model"): tensor for name, tensor in state.items()}


def build_llava(lm_dir: Path, out: Path, seed: int = 0) -> Path:
    """The LLaVA directory of the language model in `lm_dir` (a Llama-family HF directory) in `out`."""
    from transformers import (
        AutoConfig,
        AutoModelForCausalLM,
        AutoTokenizer,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
        SiglipImageProcessor,
        SiglipVisionConfig,
    )

    tokenizer = AutoTokenizer.from_pretrained(lm_dir)
    tokenizer.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
    tokenizer.chat_template = TEMPLATE
    image_id = int(tokenizer.convert_tokens_to_ids(IMAGE_TOKEN))
    text = AutoConfig.from_pretrained(lm_dir)
    text.vocab_size = -(-len(tokenizer) // VOCAB_MULTIPLE) * VOCAB_MULTIPLE
    config = LlavaConfig(vision_config=SiglipVisionConfig(**VISION), text_config=text, image_token_index=image_id,
                         projector_hidden_act="gelu", vision_feature_select_strategy="full", vision_feature_layer=-1,
                         image_seq_length=IMAGE_TOKENS, tie_word_embeddings=bool(text.tie_word_embeddings))
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(config)
    lm = AutoModelForCausalLM.from_pretrained(lm_dir, dtype=torch.float32)
    lm.resize_token_embeddings(len(tokenizer), pad_to_multiple_of=VOCAB_MULTIPLE, mean_resizing=False)
    model.model.language_model.load_state_dict(lm.model.state_dict(), strict=True)
    if not config.tie_word_embeddings:
        model.lm_head.load_state_dict(lm.lm_head.state_dict())
    out.mkdir(parents=True, exist_ok=True)
    save(model, out)
    tokenizer.save_pretrained(out)
    processor = LlavaProcessor(
        image_processor=SiglipImageProcessor(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}),
        tokenizer=tokenizer, patch_size=PATCH, vision_feature_select_strategy="full", chat_template=TEMPLATE,
        image_token=IMAGE_TOKEN, num_additional_image_tokens=0)
    processor.save_pretrained(out)
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": text.bos_token_id, "eos_token_id": text.eos_token_id, "pad_token_id": text.pad_token_id}))
    return out


def save(model: Any, out: Path) -> None:
    """save_pretrained, with the tower's weights renamed to the layout both transformers and vLLM load."""
    from safetensors.torch import load_file, save_file

    model.save_pretrained(out)
    path = out / "model.safetensors"
    save_file(vision_names(load_file(path)), path, metadata={"format": "pt"})
