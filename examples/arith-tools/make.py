"""Writes the multi-digit arithmetic task of examples/smollm2-tools.yaml as chat-format JSONL.

Products of a 3-digit and a 2-digit number and sums of two 4-digit numbers: SmolLM2-135M cannot do them in
its head, and the calculator tool (rollout.environment) does them exactly. 256 training prompts and 96
held-out ones, from disjoint seeded draws. Each conversation opens with three worked examples (a question,
the assistant's calculator call, the tool's result, the answer; two products and a sum). Asked cold,
SmolLM2-135M called the tool in 0 of 16 samples; after one example, in 3 of 16 for products, and in the
first 2 iterations of a GRPO run 6% of its trajectories called it and every call failed (held-out pass@1
0.010 with 0.13 calls per sample): nothing to learn from. After three, 5 of 8 samples of the first training
prompt called it, 2 of them well-formed with the right result.
Run: python examples/arith-tools/make.py examples/arith-tools
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path


def worked(question: str, expression: str, result: int) -> list[dict[str, str]]:
    """One worked example: the question, the assistant's calculator call, the tool's result, the answer."""
    call = json.dumps({"name": "calculator", "arguments": {"expression": expression}})
    return [{"role": "user", "content": question},
            {"role": "assistant", "content": f"<tool_call>\n{call}\n</tool_call>"},
            {"role": "tool", "name": "calculator", "content": str(result)},
            {"role": "assistant", "content": f"{expression} = {result}"}]


DEMO = [*worked("What is 218 * 47?", "218 * 47", 10246), *worked("Compute 3815 + 4092.", "3815 + 4092", 7907),
        *worked("Calculate 731 * 58.", "731 * 58", 42398)]
PHRASES = ("What is {a} {op} {b}?", "Compute {a} {op} {b}.", "Calculate {a} {op} {b}.")


def rows(n: int, seed: int) -> list[dict[str, object]]:
    r = random.Random(seed)
    out: list[dict[str, object]] = []
    for i in range(n):
        if i % 2:
            a, b, op = r.randint(100, 999), r.randint(11, 99), "*"
            answer = a * b
        else:
            a, b, op = r.randint(1000, 9999), r.randint(1000, 9999), "+"
            answer = a + b
        question = {"role": "user", "content": r.choice(PHRASES).format(a=a, b=b, op=op)}
        out.append({"messages": [*DEMO, question], "answer": answer})
    return out


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, n, seed in (("test", 96, 1), ("train", 256, 2)):
        with open(out / f"{name}.jsonl", "w") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows(n, seed))


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent))
