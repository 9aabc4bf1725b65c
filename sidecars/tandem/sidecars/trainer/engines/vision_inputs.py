"""A vision-language model's pictures as the hf engine hands them to the model, by family (config.json's model_type).

Role: the trainer's pictures travel per sample as tensors (`Sample.images`), per packed row in the order their image
tokens run (`algorithms/pictures.py`); this module turns a micro-batch's rows of them into the model's keyword
arguments, and checks them against the image tokens the rows hold:
- LLaVA (`llava`): a picture is its pixel values `[3, H, W]`; `pixel_values` stacks them; each picture is
  config.json's `image_seq_length` image tokens.
- Qwen2.5-VL (`qwen2_5_vl`): a picture is a grid of flattened patches, carried as `[t, h, w, patch]` (the processor's
  `pixel_values` rows of that picture, in its order, shaped by its `image_grid_thw`: `as_pictures`); the model gets
  the row's patches concatenated as `pixel_values` and the grids as `image_grid_thw`; each picture is
  t*h*w / spatial_merge_size**2 image tokens. Its language model takes 3-D rotary positions (temporal, height,
  width: "mrope"), which transformers computes for a sequence alone: text tokens count on, a picture's tokens take
  their place in its merged grid from where the text stopped, and the text after it goes on from the grid's
  largest side. `mrope_positions` gives each packed sample exactly those positions, from the batch's 1-D ones (per
  sample, or a shared prompt's continued by its completions: a completion goes on from its prompt's shift).
`FROZEN_PARTS`: the modules trainer.freeze names, per family. Callers: `hf_engine` (`_inputs`, `from_hf`) and the
trainer loop's `TrainerContext.pixels` (`as_pictures`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from tandem.sidecars.algorithms import pictures
from tandem.sidecars.picture_files import GRID_FAMILIES  # pictures as grids of patches, 3-D positions

FROZEN_PARTS: dict[str, dict[str, tuple[str, ...]]] = {  # trainer.freeze: the modules under the model's `model`
    "llava": {"visionTower": ("vision_tower",), "projector": ("multi_modal_projector",)},
    "qwen2_5_vl": {"visionTower": ("visual.patch_embed", "visual.blocks"), "projector": ("visual.merger",)},
}


def as_pictures(processed: Mapping[str, Any]) -> tuple[torch.Tensor, ...]:
    """An image processor's output for a prompt's pictures as one tensor per picture (float32): `[3, H, W]` each,
    or, where it gives `image_grid_thw`, each picture's patches shaped `[t, h, w, patch]`."""
    values = processed["pixel_values"].float()
    grids = processed.get("image_grid_thw")
    if grids is None:
        return tuple(values)
    out, start = [], 0
    for t, h, w in grids.tolist():
        out.append(values[start:start + t * h * w].reshape(t, h, w, -1))
        start += t * h * w
    return tuple(out)


def merge_size(config: Any) -> int:
    return int(getattr(config.vision_config, "spatial_merge_size", 1))


def image_tokens(picture: torch.Tensor, merge: int) -> int:
    """The image tokens a `[t, h, w, patch]` picture becomes (its grid, merge x merge patches a token)."""
    t, h, w = picture.shape[:3]
    return int(t * h * w) // (merge * merge)


def model_inputs(config: Any, image_token: int | None, mb_ids: torch.Tensor, positions: torch.Tensor,
                 segments: torch.Tensor, prefixes: torch.Tensor | None, rows: Sequence[Sequence[torch.Tensor]],
                 dtype: torch.dtype) -> dict[str, Any]:
    """The picture arguments (and, for a grid family, the 3-D `position_ids`) of a micro-batch whose rows hold
    `rows` pictures; ValueError when the pictures do not match the image tokens the rows hold."""
    found = [t for row in rows for t in row]
    if not found:
        return {}
    if config.model_type not in GRID_FAMILIES:
        per_image = getattr(config, "image_seq_length", None)
        if image_token is not None and per_image is not None:
            pictures.count_check(mb_ids, found, image_token, int(per_image))
        return {"pixel_values": torch.stack(found).to(device=mb_ids.device, dtype=dtype)}
    if image_token is None:
        raise ValueError(f"{config.model_type} has no image_token_id in its config")
    merge = merge_size(config)
    pictures.count_check(mb_ids, found, image_token, [image_tokens(t, merge) for t in found])
    grids = torch.tensor([list(t.shape[:3]) for t in found], dtype=torch.long, device=mb_ids.device)
    patches = torch.cat([t.reshape(-1, t.shape[-1]) for t in found]).to(device=mb_ids.device, dtype=dtype)
    return {"pixel_values": patches, "image_grid_thw": grids,
            "position_ids": mrope_positions(mb_ids, positions, segments, prefixes, rows, image_token, merge)}


def mrope_positions(ids: torch.Tensor, positions: torch.Tensor, segments: torch.Tensor, prefixes: torch.Tensor | None,
                    rows: Sequence[Sequence[torch.Tensor]], image_token: int, merge: int) -> torch.Tensor:
    """`[3, rows, len]` positions of packed samples (1-D `positions` restarting per sample, a shared prompt's
    completions going on from it: `prefixes` names their prompt's segment) as transformers gives each sample
    alone: a picture of merged grid (t, h', w') starting where its sample's text stands at p takes (p + i, p + j,
    p + k) for its token (i, j, k), and the text after it shifts by max(h', w') - t*h'*w' (the grid's largest side
    in place of its token count), in its own segment and in every segment that shares it as a prompt."""
    out = positions.unsqueeze(0).repeat(3, 1, 1)
    for r, row in enumerate(rows):
        cols = (ids[r] == image_token).nonzero().flatten().tolist()
        shift = torch.zeros_like(positions[r])
        blocks = []
        at = 0
        for picture in row:
            t, h, w = picture.shape[0], picture.shape[1] // merge, picture.shape[2] // merge
            block = cols[at:at + t * h * w]
            at += t * h * w
            if len(block) != t * h * w or block[-1] - block[0] != len(block) - 1:
                raise ValueError(f"row {r}: a picture of {t * h * w} image tokens does not sit on a run of them")
            seg = int(segments[r, block[0]])
            blocks.append((block[0], t, h, w))
            after = torch.arange(positions.shape[1], device=positions.device) > block[-1]
            mine = segments[r] == seg
            if prefixes is not None:
                mine = mine | (prefixes[r] == seg)
            shift += torch.where(after & mine, max(h, w) - t * h * w, 0)
        out[:, r] += shift
        for start, t, h, w in blocks:
            grid = torch.stack(torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij"))
            out[:, r, start:start + t * h * w] = out[0, r, start] + grid.reshape(3, -1).to(out.device)
    return out
