"""The rollout/trainer mismatch where people look on one machine: `tandem run`'s live table shows the drift
guard's warning or pause, and the run summary the mismatch's KL and when the guard fired."""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console

from tandem.cli.local import _table
from tandem.cli.plot import print_summary
from tandem.spec.load import load_job
from tandem.spec.progress import Progress

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
WARN = "algorithm.mismatchGuard: mismatch_kl 0.04 > 0.01 in 3 consecutive iterations (iterations 2-4); action warn"


def shown(progress: Progress) -> str:
    console = Console(record=True, width=400)
    console.print(_table(load_job(EXAMPLES / "smollm2-grpo.yaml"), progress, time.monotonic(), []))
    return " ".join(console.export_text().split())  # the caption wraps at the table's width


def test_the_live_table_shows_a_warning_and_a_pause() -> None:
    assert WARN in shown(Progress(phase="train", iteration=5, iterations=10, guard=WARN))
    paused = shown(Progress(phase="paused", iteration=5, iterations=10, guard=WARN, message="paused: " + WARN))
    assert "paused: " + WARN in paused and paused.count(WARN) == 1
    assert "mismatchGuard" not in shown(Progress(phase="train", iteration=5, iterations=10))


def test_the_summary_shows_the_mismatch_kl_and_the_guard() -> None:
    rows = [{"iteration": i, "reward_mean": 0.1, "mismatch_mean": 0.01, "mismatch_max": 0.1, "mismatch_kl": kl,
             **({"mismatch_guard": {"action": "warn", "streak": 2}} if i >= 2 else {})}
            for i, kl in enumerate([1e-4, 3e-4, 2e-2, 5e-2])]
    console = Console(record=True, width=160)
    print_summary(rows, console)
    text = console.export_text()
    assert "mismatch KL per token, mean (max)" in text and "1.76e-02 (5.00e-02)" in text
    assert "mismatch guard fired (first)" in text and "2 (2)" in text
