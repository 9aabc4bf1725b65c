"""The pictures of a multi-turn conversation (vision-language models): the row's, and those an environment answers with.

Role: the chat template renders an image part `{"type": "image"}` as the model's image placeholder; vLLM expands each
placeholder to the picture's image tokens. A row's first messages carry its pictures as such bare parts (the trainer
read and checked them; they come beside the messages, in order). An environment's messages (its reset's or a
step's) carry their pictures in the part: `{"type": "image", "image": <PIL image>}` (one it made), or the dataset's
forms (`{"type": "image_url", "image_url": {"url": "data:image/png;base64,..." | "file://..."}}`, `{"type":
"image", "path": ...}`), read by `picture_files` under the job's `dataset.images` pixel limit and resize policy.
`Conversation.take` returns the messages with every image part bare, the pictures in order and each one's image
tokens (`picture_files.tokens_per_picture`). A picture an environment sends that cannot be used (unreadable, over
the pixel limit, one more than `rollout.environment.maxPictures` in its trajectory, a bare part, or any picture when
the model takes none) becomes a text part saying so and is counted (`refused`); the trajectory goes on. A
message left with text parts alone becomes one string, as a text model's chat template renders it.
Caller: the multi-turn driver (`multi_turn.MultiTurnDriver`), one `Conversation` per trajectory.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image

from tandem.sidecars import picture_files
from tandem.sidecars.picture_files import PerImage

Message = dict[str, Any]
REFUSED = "(a picture was refused: {why})"


@dataclass(frozen=True)
class PictureRules:
    """What a job allows: the model's image tokens per picture (None: the model takes no pictures), the pictures an
    environment may add to one trajectory, and the dataset's pixel limit and resize policy."""

    tokens: PerImage | None = None
    max_pictures: int = 4
    limits: picture_files.Limits = picture_files.Limits()

    def count(self, picture: Any) -> int:
        assert self.tokens is not None
        return self.tokens if isinstance(self.tokens, int) else self.tokens(picture)


class Conversation:
    """One trajectory's pictures: how many its environment added and how many were refused."""

    def __init__(self, rules: PictureRules) -> None:
        self.rules = rules
        self.added = 0
        self.refused = 0

    def take(self, messages: Sequence[Message], given: Sequence[Any] = ()
             ) -> tuple[list[Message], list[Any], list[int]]:
        """(`messages` with every image part bare, their pictures in order, each one's image tokens). Bare parts
        take the `given` pictures in order (the row's, already checked); every one of them must be used."""
        given = list(given)
        found: list[Any] = []

        def read(part: dict[str, Any]) -> dict[str, Any]:
            if _bare(part) and given:
                found.append(given.pop(0))
                return {"type": "image"}
            try:
                found.append(self._picture(part))
                self.added += 1
                return {"type": "image"}
            except picture_files.Refused as e:
                self.refused += 1
                return {"type": "text", "text": REFUSED.format(why=e)}

        out = [_plain(m) for m in picture_files.each_image_part(messages, read)]
        if given:
            raise ValueError(f"{len(given)} of the row's pictures have no image part in its messages")
        return out, found, [self.rules.count(p) for p in found]

    def _picture(self, part: dict[str, Any]) -> Any:
        """An environment's picture, checked; Refused with the reason."""
        if self.rules.tokens is None:
            raise picture_files.Refused("the model takes no pictures (not a vision-language model)")
        if self.added >= self.rules.max_pictures:
            raise picture_files.Refused(f"more than {self.rules.max_pictures} pictures in one trajectory "
                                        "(rollout.environment.maxPictures)")
        if _bare(part):
            raise picture_files.Refused("an image part of an environment's message holds no picture (give it as "
                                        "image, a PIL image, or an image_url)")
        made = part.get("image")
        if isinstance(made, Image.Image):  # checked in memory, as a file's picture is once decoded
            return picture_files.fit(made, self.rules.limits, "a picture the environment made")
        return picture_files.load(picture_files.source_of(part), Path.cwd(), self.rules.limits)


def _bare(part: dict[str, Any]) -> bool:
    return part.get("type") == "image" and not any(part.get(k) is not None for k in ("image", "path", "url"))


def _plain(message: Message) -> Message:
    """A message whose content parts are all text (its pictures refused) as one string: text-only chat templates
    render a string, not parts."""
    content = message.get("content")
    if isinstance(content, list) and content and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return {**message, "content": "".join(str(p.get("text", "")) for p in content)}
    return message
