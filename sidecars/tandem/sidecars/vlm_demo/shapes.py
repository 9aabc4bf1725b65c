"""The VLM demo's visual task: which colour is the circle (or the square), asked of a rendered picture.

Role: `render(rng)` draws one 64x64 picture with Pillow: a circle and a square of two different colours
(of COLOURS) at random places and sizes on a grey ground, and asks the colour of one of them; the answer is
verifiable and only the picture holds it (the question names the shape, never its colour), so with the
image removed a model stays at chance: 1 in len(COLOURS). Binding a colour to a shape is more than a glance
at the picture's mean colour, so the supervised warm-up (warmup.py) leaves room for RL.
`write_split(dir, name, n, seed)` writes `<name>.jsonl` and the pictures under `images/<name>/`: chat rows
whose user turn holds an image part (a path relative to the dataset file) and the question, and the answer.
Train and held-out are disjoint by generator seed. Callers: warmup.py, build.py, `examples/vlm-shapes/`.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, ImageDraw

SIZE = 64
COLOURS = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (50, 80, 220), "yellow": (235, 210, 40),
           "purple": (150, 60, 190), "orange": (245, 140, 30)}
SHAPES = ("circle", "square")
GROUND = (128, 128, 128)
QUESTIONS = ("What colour is the {shape}? Answer with one word.", "Which colour does the {shape} have?",
             "Name the colour of the {shape} in the picture.", "The {shape} in this image: what colour is it?")


@dataclass(frozen=True)
class Picture:
    image: Image.Image
    question: str
    answer: str


def render(rng: random.Random) -> Picture:
    """One picture: a circle and a square of two different colours, and a question about one of them."""
    image = Image.new("RGB", (SIZE, SIZE), GROUND)
    draw = ImageDraw.Draw(image)
    first, second = rng.sample(sorted(COLOURS), 2)
    boxes = _two_boxes(rng)
    for shape, colour, box in zip(SHAPES, (first, second), boxes, strict=True):
        if shape == "circle":
            draw.ellipse(box, fill=COLOURS[colour])
        else:
            draw.rectangle(box, fill=COLOURS[colour])
    asked = rng.randrange(2)
    question = rng.choice(QUESTIONS).format(shape=SHAPES[asked])
    return Picture(image, question, (first, second)[asked])


def _two_boxes(rng: random.Random) -> tuple[tuple[int, int, int, int], tuple[int, int, int, int]]:
    """Two boxes that do not overlap: the picture split in two halves (left/right or top/bottom), one each."""
    side = rng.randrange(16, 28)
    other = rng.randrange(16, 28)
    vertical = rng.random() < 0.5
    halves = [(0, 0, SIZE // 2, SIZE), (SIZE // 2, 0, SIZE, SIZE)] if not vertical else \
        [(0, 0, SIZE, SIZE // 2), (0, SIZE // 2, SIZE, SIZE)]
    rng.shuffle(halves)
    out = []
    for (x0, y0, x1, y1), s in zip(halves, (side, other), strict=True):
        x = rng.randrange(x0, max(x0 + 1, x1 - s))
        y = rng.randrange(y0, max(y0 + 1, y1 - s))
        out.append((x, y, x + s, y + s))
    return out[0], out[1]


def write_split(root: Path, name: str, n: int, seed: int) -> Path:
    """`root/<name>.jsonl` with n rows and their pictures under `root/images/<name>/` (paths relative to
    root), from generator seed `seed`."""
    rng = random.Random(seed)
    images = root / "images" / name
    images.mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(n):
        pic = render(rng)
        rel = f"images/{name}/{i:05d}.png"
        pic.image.save(root / rel)
        lines.append(json.dumps({"messages": [{"role": "user", "content": [
            {"type": "image", "path": rel}, {"type": "text", "text": pic.question}]}], "answer": pic.answer}))
    path = root / f"{name}.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path
