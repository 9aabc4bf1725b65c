"""worker/tower_names.py: a flattened SigLIP or CLIP tower's names go under vision_model., once; nothing else moves."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tandem.checkpoint_engine.versions.tower_names import tower_of, vllm_name


@pytest.mark.parametrize(("name", "tower", "expected"), [
    ("model.vision_tower.embeddings.patch_embedding.weight", "siglip_vision_model",
     "model.vision_tower.vision_model.embeddings.patch_embedding.weight"),
    ("vision_tower.encoder.layers.0.mlp.fc1.weight", "clip_vision_model",
     "vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight"),
    ("vision_tower.vision_model.post_layernorm.weight", "siglip_vision_model",
     "vision_tower.vision_model.post_layernorm.weight"),  # already in vLLM's layout
    ("model.language_model.layers.0.mlp.up_proj.weight", "siglip_vision_model",
     "model.language_model.layers.0.mlp.up_proj.weight"),
    ("model.multi_modal_projector.linear_1.weight", "siglip_vision_model",
     "model.multi_modal_projector.linear_1.weight"),
    ("model.vision_tower.transformer.layers.0.attention.wq.weight", "pixtral",
     "model.vision_tower.transformer.layers.0.attention.wq.weight"),  # a tower vLLM reads as transformers saves it
    ("model.layers.0.self_attn.q_proj.weight", None, "model.layers.0.self_attn.q_proj.weight"),  # a text model
])
def test_vllm_name(name: str, tower: str | None, expected: str) -> None:
    assert vllm_name(name, tower) == expected


def test_tower_of_reads_the_vision_config() -> None:
    assert tower_of(SimpleNamespace(vision_config=SimpleNamespace(model_type="siglip_vision_model"))) == \
        "siglip_vision_model"
    assert tower_of(SimpleNamespace(model_type="llama")) is None
