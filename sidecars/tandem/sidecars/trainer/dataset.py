"""Prompt dataset of a job: a JSONL file read once, sampled deterministically per iteration.

Caller: the driver (`tandem.sidecars.trainer.driver`). Each line is a JSON object holding the
spec's `dataset.promptField` and, for rule-based rewards, `dataset.answerField`. Bad lines are
reported with the file and line number.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from tandem.spec.models import Dataset as DatasetSpec


class DatasetError(ValueError):
    pass


@dataclass(frozen=True)
class Prompt:
    text: str
    answer: str | None
    index: int


class PromptDataset:
    def __init__(self, prompts: list[Prompt], seed: int = 0):
        if not prompts:
            raise DatasetError("dataset is empty")
        self.prompts = prompts
        self.seed = seed

    @classmethod
    def load(cls, spec: DatasetSpec, seed: int = 0) -> PromptDataset:
        path = Path(spec.path)
        try:
            lines = path.read_text().splitlines()
        except OSError as e:
            raise DatasetError(f"dataset.path: cannot read {path}: {e.strerror or e}") from None
        out: list[Prompt] = []
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DatasetError(f"{path}:{n}: not valid JSON ({e.msg})") from None
            if not isinstance(row, dict) or not isinstance(row.get(spec.prompt_field), str):
                raise DatasetError(f"{path}:{n}: field {spec.prompt_field!r} (dataset.promptField) missing "
                                   "or not a string")
            answer = row.get(spec.answer_field)
            out.append(Prompt(row[spec.prompt_field], None if answer is None else str(answer), len(out)))
        return cls(out, seed)

    def batch(self, iteration: int, size: int) -> list[Prompt]:
        """The prompts of an iteration: a seeded shuffle per epoch, so a resumed run sees the same ones."""
        out: list[Prompt] = []
        start = iteration * size
        while len(out) < size:
            epoch, offset = divmod(start + len(out), len(self.prompts))
            order = list(range(len(self.prompts)))
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
            take = order[offset: offset + size - len(out)]
            out += [self.prompts[i] for i in take]
        return out
