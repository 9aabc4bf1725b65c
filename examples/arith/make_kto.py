"""Writes a labelled (KTO) dataset from the arithmetic prompts: each prompt twice, once with the right answer
(label true, desirable) and once with a wrong one (label false, undesirable).

Role: the data of examples/smollm2-kto.yaml (`kto-train.jsonl`, from `train.jsonl` of make.py, each
completion in the demo's words: "The answer is 13.") and of the KTO end-to-end test, which calls
`labelled` on the toy task's prompts with the toy's answer format (" <answer>13</answer>"). A wrong
answer is the right one moved by 1 to 3 either way (never below 0), drawn from a seeded generator, so
a rerun writes the same file. Every row keeps its own fields (messages or prompt, answer) and gains
`completion` and `label`: the job names them in dataset.completionField and dataset.labelField.
Run: python examples/arith/make_kto.py [examples/arith]
"""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

COMPLETION = "The answer is {answer}."  # the demo's words; its answerMatch (flexible) reads the last number


def wrong_answer(right: int, rng: random.Random) -> int:
    """A plausible mistake: right +- 1..3, at least 0, never right."""
    choices = [right + d for d in (-3, -2, -1, 1, 2, 3) if right + d >= 0]
    return rng.choice(choices)


def labelled(rows: Iterable[dict[str, Any]], completion: str = COMPLETION, *, answer_field: str = "answer",
             seed: int = 0) -> Iterator[dict[str, Any]]:
    """Two labelled rows per prompt row: `completion` with the right answer (true), then a wrong one (false)."""
    rng = random.Random(seed)
    for row in rows:
        right = int(float(row[answer_field]))
        yield {**row, "completion": completion.format(answer=right), "label": True}
        yield {**row, "completion": completion.format(answer=wrong_answer(right, rng)), "label": False}


def write(rows: Iterable[dict[str, Any]], path: Path) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def main(folder: Path) -> None:
    prompts = [json.loads(line) for line in (folder / "train.jsonl").read_text().splitlines() if line.strip()]
    write(labelled(prompts), folder / "kto-train.jsonl")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent))
