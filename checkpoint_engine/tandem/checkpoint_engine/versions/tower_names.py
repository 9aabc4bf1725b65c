"""The names of a vision tower's weights as vLLM loads them, from the names transformers 5 gives them.

Role: transformers 5 keeps a SigLIP or CLIP vision tower's layers at the tower's root (`model.vision_tower.
embeddings.*`, saved as `vision_tower.embeddings.*`), where vLLM 0.32's LLaVA-family models look for them one
level down, as every checkpoint before transformers 5 had them (`vision_tower.vision_model.embeddings.*`;
transformers 5 loads that layout too). `vllm_name(name, tower)` inserts `vision_model.` after the tower's
prefix for such a tower (`tower`: the vision config's model_type); any other name, or tower, is left as it is.
Callers: the rollout worker's shm loader (versions carry transformers' names), the export (`hf_export`: an
exported directory loads in both libraries), and the VLM demo's builder, which saves in that layout too. Imports
nothing.
"""

from __future__ import annotations

FLAT_TOWERS = ("siglip_vision_model", "clip_vision_model")  # towers transformers 5 flattens
PREFIXES = ("model.vision_tower.", "vision_tower.")


def vllm_name(name: str, tower: str | None) -> str:
    if tower not in FLAT_TOWERS:
        return name
    for prefix in PREFIXES:
        if name.startswith(prefix):
            rest = name[len(prefix):]
            return name if rest.startswith("vision_model.") else f"{prefix}vision_model.{rest}"
    return name


def tower_of(config: object) -> str | None:
    """The vision tower's model_type of a (transformers or vLLM hf_config) model config, None for text models."""
    vision = getattr(config, "vision_config", None)
    found = getattr(vision, "model_type", None)
    return found if isinstance(found, str) else None
