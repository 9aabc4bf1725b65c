"""A packed batch's pictures (vision-language models): each row's pixel values in the order its image tokens run.

Role: a vision-language model replaces its image-token embeddings with the features of the pictures it is given,
taken in order; a packed row holds several samples, so the row's pictures are its samples' pictures in the order
their prompts sit in the row. A sample packed whole carries its prompt (and so its pictures) at its own start; a
group whose prompt is shared (`packing`, `share_prompts`) holds the prompt once, in a prefix segment, so its
pictures count once there (the shared part is the prompt but its last token, and a picture's tokens never end a
prompt: the chat template puts the generation prompt after them). A multi-turn sample's completion may hold
pictures too (an environment's answer): they follow its prompt's, in its own segment.
Caller: `algorithm_interface.pack_samples`; the hf engine (`hf_engine._inputs`, through
`engines/vision_inputs.py`) hands a micro-batch's rows' pictures to the model and checks their count against the
image tokens it holds.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tandem.sidecars.algorithms.packing import Placement


def by_row(placements: Sequence[Placement], images: Sequence[Sequence[torch.Tensor]], rows: int,
           completion_images: Sequence[Sequence[torch.Tensor]] | None = None) -> list[list[torch.Tensor]] | None:
    """Per row, the pictures of the samples placed in it, by position (`images[i]`: sample i's prompt's,
    `completion_images[i]`: those in its completion, a multi-turn environment's); None when no sample has one."""
    later = completion_images or [() for _ in images]
    if not any(images) and not any(later):
        return None
    found: list[dict[tuple[int, int], Sequence[torch.Tensor]]] = [{} for _ in range(rows)]
    for p in placements:
        if images[p.sample]:
            where = p.prefix_start if p.shared > 0 else p.start  # a shared prompt's prefix: once for the group
            found[p.row].setdefault((where, 0), images[p.sample])
        if later[p.sample]:  # after its prompt, in the sample's own segment
            found[p.row][(p.start, 1)] = later[p.sample]
    return [[t for _, pics in sorted(row.items(), key=lambda kv: kv[0]) for t in pics] for row in found]


def count_check(ids: torch.Tensor, pictures: Sequence[torch.Tensor], image_token: int,
                per_image: int | Sequence[int]) -> None:
    """ValueError unless `ids` holds exactly the image tokens of `pictures`: `per_image` each, or `per_image[i]` for
    picture i where each picture has its own count (what the model would otherwise refuse, or silently misplace)."""
    held = int((ids == image_token).sum())
    if isinstance(per_image, int):
        if held != per_image * len(pictures):
            raise ValueError(f"a micro-batch holds {held} image tokens for {len(pictures)} pictures of {per_image} "
                             "tokens each: the samples' prompt ids and pictures do not match")
    elif held != sum(per_image):
        raise ValueError(f"a micro-batch holds {held} image tokens for {len(pictures)} pictures of "
                         f"{sum(per_image)} tokens in all ({', '.join(map(str, per_image))}): the samples' prompt ids "
                         "and pictures do not match")
