"""Multi-turn metrics where people look: the run summary, the progress plot and `tandem run`'s live table show
turns and tool calls per trajectory, the failed share of calls and the tool-time share."""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console

from tandem.cli.local import _table
from tandem.cli.plot import plot_metrics, print_summary
from tandem.spec.load import load_job
from tandem.spec.progress import Progress

EXAMPLES = Path(__file__).parents[2] / "examples"

ROWS = [{"iteration": i, "reward_mean": 0.1 * i, "seconds": {"rollout": 2.0, "train": 3.0}, "turns_mean": 1.5 + i,
         "tool_calls_mean": 0.5 * i, "tool_error_frac": 0.25, "tool_share": 0.1} for i in range(4)]


def test_the_summary_and_plot_show_turns_and_tools(tmp_path: Path) -> None:
    console = Console(record=True, width=120)
    print_summary(ROWS, console)
    text = console.export_text()
    assert "turns / tool calls per trajectory" in text and "3.00 / 0.75" in text  # means over the 4 iterations
    assert "failed share of calls / tool time share" in text and "0.25 / 0.10" in text
    plain = Console(record=True, width=120)
    print_summary([{k: v for k, v in r.items() if "tool" not in k and "turns" not in k} for r in ROWS], plain)
    assert "tool calls" not in plain.export_text()
    path = plot_metrics(ROWS, tmp_path / "progress.png", "job", evals=[
        {"iteration": 0, "pass_at_1": 0.1, "tool_calls_mean": 0.2}, {"iteration": 3, "pass_at_1": 0.3}])
    assert path.stat().st_size > 10_000


def test_the_live_table_has_turn_columns_for_multi_turn_jobs() -> None:
    tools = load_job(EXAMPLES / "smollm2-tools.yaml")
    progress = Progress(phase="train", iteration=3, iterations=10, weight_version=3, turns_mean=2.25,
                        tool_calls_mean=1.5)
    console = Console(record=True, width=160)
    console.print(_table(tools, progress, time.monotonic(), []))
    console.print(_table(tools, None, time.monotonic(), []))
    text = console.export_text()
    assert "turns" in text and "tool calls" in text and "2.25" in text and "1.50" in text
    single = Console(record=True, width=160)
    single.print(_table(load_job(EXAMPLES / "smollm2-grpo.yaml"), progress, time.monotonic(), []))
    assert "tool calls" not in single.export_text()
