"""A multi-turn environment with pictures, for the shapes task (examples/vlm-grpo.yaml): after the model's first
answer it shows the middle of the picture enlarged and asks again; the job's rewards judge the final answer.

Loaded by examples/vlm-look-again.yaml as `rollout.environment: {type: custom, entryPoint: look_again:LookAgain,
pythonPath: [examples/shapes-look]}`. Its `reset` gets the row's fields with the row's pictures (`pictures`: RGB PIL
images, in order); its `step` answers with a user message whose content parts hold a picture it made (`{"type":
"image", "image": <PIL image>}`), which the rollout renders as the model's image placeholder and sends to vLLM with
the conversation's other pictures (rollout.environment.maxPictures bounds how many a trajectory may get).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tandem.sidecars.envs.environments import Message, Step, TurnStats


class LookAgain:
    def __init__(self, zoom: float = 2.0, ask: str = "Here is the middle of the picture, enlarged. Your final "
                 "answer, in one word?") -> None:
        if zoom < 1.0:
            raise ValueError(f"zoom must be >= 1, got {zoom}")
        self.zoom, self.ask = zoom, ask
        self.stats = TurnStats()
        self.picture: Any = None

    def tools(self) -> list[dict[str, Any]]:
        return []

    def reset(self, row: Mapping[str, Any], messages: list[Message]) -> list[Message]:
        self.stats = TurnStats()
        pictures = row.get("pictures") or []
        self.picture = pictures[0] if pictures else None
        return list(messages)

    def step(self, reply: str) -> Step:
        self.stats.turns += 1
        self.stats.per_turn.append(0)
        if self.stats.turns > 1 or self.picture is None:
            return Step([], done=True)
        w, h = self.picture.size
        cw, ch = max(1, round(w / self.zoom)), max(1, round(h / self.zoom))
        box = ((w - cw) // 2, (h - ch) // 2, (w - cw) // 2 + cw, (h - ch) // 2 + ch)
        closer = self.picture.crop(box).resize((w, h))  # as many pixels as the row's picture: its limits hold
        return Step([{"role": "user", "content": [{"type": "image", "image": closer},
                                                  {"type": "text", "text": self.ask}]}], done=False)
