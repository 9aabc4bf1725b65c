"""The demo's toy task: two-operand integer arithmetic with a required answer format.

Role: generates the prompts (JSONL with `prompt`/`answer` fields, the spec's default
`Dataset.prompt_field`/`answer_field`), the supervised targets for the warm-up, and the reward
settings that go with them. Callers: `toy.build`, the demo job in examples/, tests.

A problem reads `What is 17+25? Answer:`; the expected completion is ` <answer>42</answer>`
followed by the end-of-sequence token. `FORMAT_PATTERN` (for the spec's `format` reward, fullmatch
semantics) accepts exactly that shape with any integer; `answerMatch` extracts the number inside
the tags. Operands are drawn from [0, max_operand) — 20 by default: 400 distinct sums, which the
tiny model learns gradually (accuracy rises smoothly with warm-up steps, unlike two-digit sums where
it jumps late and unpredictably) — and `-` problems never go negative.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

FORMAT_PATTERN = r"<answer>-?\d+</answer>"
OPS = ("+", "-")


def prompt_text(a: int, op: str, b: int) -> str:
    return f"What is {a}{op}{b}? Answer:"


def target_completion(answer: int | str) -> str:
    return f" <answer>{answer}</answer>"


def solve(a: int, op: str, b: int) -> int:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    raise ValueError(f"unknown operator {op!r}")


def make_problems(
    seed: int, n: int, *, max_operand: int = 20, ops: Sequence[str] = ("+",)
) -> list[dict[str, str]]:
    """`n` problems {prompt, answer} drawn with `random.Random(seed)` (deterministic)."""
    rng = random.Random(seed)
    rows: list[dict[str, str]] = []
    for _ in range(n):
        op = rng.choice(list(ops))
        a, b = rng.randrange(max_operand), rng.randrange(max_operand)
        if op == "-" and b > a:
            a, b = b, a
        rows.append({"prompt": prompt_text(a, op, b), "answer": str(solve(a, op, b))})
    return rows


def write_jsonl(rows: Iterable[dict[str, Any]], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with tmp.open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    tmp.replace(path)
    return path


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    with path.open() as f:
        return [json.loads(line) for line in f if line.strip()]


def reward_specs(format_weight: float = 0.1) -> list[dict[str, Any]]:
    """The demo's `spec.rewards` (wire names): correctness plus a small format bonus."""
    return [{"type": "answerMatch", "weight": 1.0},
            {"type": "format", "pattern": FORMAT_PATTERN, "weight": format_weight}]


def corpus(seed: int, n: int = 4000) -> list[str]:
    """Text to train the tokenizer on: problems with their answers plus a few plain sentences."""
    rows = make_problems(seed, n, max_operand=100, ops=OPS)
    texts = [r["prompt"] + target_completion(r["answer"]) for r in rows]
    texts += [
        "The quick brown fox jumps over the lazy dog.", "Please answer the question with a number.",
        "This is a small model trained on arithmetic problems.", "Reward, policy, reference, value.",
        "What is the sum? What is the difference? The result is correct.",
    ] * 20
    return texts
