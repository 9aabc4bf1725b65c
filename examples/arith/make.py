"""Writes the single-digit addition task of examples/smollm2-grpo.yaml as chat-format JSONL.

Every ordered pair a + b with a, b in 1..9 is one prompt (an OpenAI-style `messages` list); a
seeded shuffle puts 24 pairs in the held-out test set and the other 57 in the training set, so the
evaluation asks sums the policy never trained on. Run: python examples/arith/make.py examples/arith
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

PHRASES = ("What is {a} + {b}?", "Compute {a} + {b}.", "What do you get when you add {a} and {b}?")


def rows(pairs: list[tuple[int, int]], seed: int) -> list[dict[str, object]]:
    r = random.Random(seed)
    return [{"messages": [{"role": "user", "content": r.choice(PHRASES).format(a=a, b=b)}], "answer": a + b}
            for a, b in pairs]


def main(out: Path) -> None:
    pairs = [(a, b) for a in range(1, 10) for b in range(1, 10)]
    random.Random(0).shuffle(pairs)
    out.mkdir(parents=True, exist_ok=True)
    for name, part, seed in (("test", pairs[:24], 1), ("train", pairs[24:], 2)):
        with open(out / f"{name}.jsonl", "w") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows(part, seed))


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent))
