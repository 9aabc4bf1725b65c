"""`tandem run`'s progress when its output is not a terminal: one plain line per iteration.

Role: a pipe, a file, `nohup` or a pod's log gets nothing from rich's Live table (it redraws in place, and
without a terminal rich prints only its last frame, at the end). `PlainLines` prints instead one line per
finished iteration, read from the run's metrics.jsonl (the driver appends a row per iteration, so no
iteration is missed however fast they go, as a poll of the progress record would miss them):

    iteration 3/15  reward 0.412  pass@1 0.600  9.8 s/it  ETA 1m58s

(pass@1 only for an iteration followed by a held-out evaluation, `spec.eval`), the evaluation of the
starting weights once, and each new message or drift-guard line of the progress record (the driver waiting
for a healthy rollout, a pause). `interactive` is the choice between the two displays.
Caller: `tandem.cli.local._follow`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from tandem.operator.policies.eta import human
from tandem.spec.progress import Progress

RATE_WINDOW = 5  # the ETA's seconds per iteration: the mean of the latest rows' (a warm-up's first is slower)


def interactive(console: Console) -> bool:
    """The live table only on a terminal (rich's own test: the stream is a TTY, or FORCE_COLOR/force_terminal)."""
    return console.is_terminal


def iteration_line(row: dict[str, Any], iterations: int, seconds_per_iteration: float | None) -> str:
    """The line of one metrics row: iteration done/total, reward, pass@1 when evaluated, s/it, ETA."""
    done = int(row["iteration"]) + 1
    parts = [f"iteration {done}/{iterations}"]
    if (reward := row.get("reward_mean")) is not None:
        parts.append(f"reward {float(reward):.3f}")
    if isinstance(ev := row.get("eval"), dict) and ev.get("pass_at_1") is not None:
        parts.append(f"pass@1 {float(ev['pass_at_1']):.3f}")
    if (seconds := row.get("total_seconds")) is not None:
        parts.append(f"{float(seconds):.1f} s/it")
    if seconds_per_iteration is not None:
        parts.append(f"ETA {human(int(round(max(0, iterations - done) * seconds_per_iteration)))}")
    return "  ".join(parts)


class PlainLines:
    """Prints each new metrics row of `run_dir` as one line, and the record's new notes; `update` each poll."""

    def __init__(self, run_dir: Path, iterations: int, emit: Callable[[str], None], since: float = 0.0) -> None:
        self.metrics = run_dir / "metrics.jsonl"
        # a resumed run appends to the rows of the runs before it: only this run's are printed
        self.offset = self.metrics.stat().st_size if self.metrics.exists() else 0
        self.iterations = iterations
        self.emit = emit
        self.seconds: list[float] = []
        self.rows = 0
        self.notes: set[str] = set()
        self.start_eval_shown = False
        self.since = since  # a resumed run's record is the last run's until its driver writes

    def update(self, progress: Progress | None) -> None:
        for row in self._new_rows():
            if (seconds := row.get("total_seconds")) is not None:
                self.seconds.append(float(seconds))
            recent = self.seconds[-RATE_WINDOW:]
            self.emit(iteration_line(row, self.iterations, sum(recent) / len(recent) if recent else None))
            self.rows += 1
        if progress is None or progress.updated_at < self.since:
            return
        ev = progress.eval
        if ev is not None and not self.rows and not self.start_eval_shown:
            self.start_eval_shown = True  # later evaluations ride on their iteration's line
            self.emit(f"eval after {ev.iteration} iterations: pass@1 {ev.pass_at_1:.3f} "
                      f"pass@{ev.k} {ev.pass_at_k:.3f} on {ev.prompts} prompts")
        for note in (progress.message, progress.guard):
            if note and note not in self.notes and progress.phase not in ("done", "failed"):
                self.notes.add(note)  # a failure's line is the run's last word (`supervise.diagnosis`)
                self.emit(note)

    def _new_rows(self) -> list[dict[str, Any]]:
        """Complete rows appended since the last call (a row half-written stays for the next)."""
        if not self.metrics.exists():
            return []
        with open(self.metrics, "rb") as f:
            f.seek(self.offset)
            chunk = f.read()
        end = chunk.rfind(b"\n") + 1
        self.offset += end
        return [json.loads(line) for line in chunk[:end].decode().splitlines() if line.strip()]
