"""The arithmetic task's held-out eval, large enough to tell pass@1 apart: 96 prompts.

examples/arith/test.jsonl holds the 24 sums the training set never asks (every other single-digit pair is
a training prompt); each is asked here in 4 phrasings, 96 prompts in all, so 4 samples each give pass@1 a
standard error of about 0.025. Callers: bench/rl_vs_trl.py and bench/rollout_modes.py (their spec.eval).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

ARITH = Path(__file__).resolve().parents[1] / "examples" / "arith"
PHRASES = ("What is {a} + {b}?", "Compute {a} + {b}.", "What do you get when you add {a} and {b}?",
           "Add {a} and {b}.")


def rows() -> list[dict[str, Any]]:
    """The 24 held-out sums of examples/arith/test.jsonl, each in every phrasing (phrasing-major order)."""
    held = [json.loads(x) for x in (ARITH / "test.jsonl").read_text().splitlines() if x.strip()]
    pairs = [tuple(int(t) for t in re.findall(r"\d+", r["messages"][0]["content"])) for r in held]
    return [{"messages": [{"role": "user", "content": p.format(a=a, b=b)}], "answer": a + b}
            for p in PHRASES for a, b in pairs]


def write(out: Path) -> Path:
    """Write the 96 prompts to `out`/test-96.jsonl; its path."""
    path = out / "test-96.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows()))
    return path
