"""`tandem run` without a terminal (CI, nohup, a pod's log): one plain line per iteration, not rich's Live table;
on a terminal the table, as before."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

from rich.console import Console
from rich.live import Live

from tandem.cli.local import _display
from tandem.cli.progress_lines import PlainLines, interactive, iteration_line
from tandem.operator.policies.eta import human
from tandem.spec.load import load_job
from tandem.spec.progress import EvalSummary, Progress

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def row(i: int, reward: float, seconds: float, **extra: object) -> str:
    return json.dumps({"iteration": i, "reward_mean": reward, "total_seconds": seconds, **extra}) + "\n"


def test_the_line_says_iteration_reward_pass_at_1_seconds_and_eta() -> None:
    evaluated = {"iteration": 4, "reward_mean": 0.4125, "total_seconds": 9.84, "eval": {"pass_at_1": 0.6}}
    assert iteration_line(evaluated, 15, 9.8) == "iteration 5/15  reward 0.412  pass@1 0.600  9.8 s/it  ETA 1m38s"
    plain = {"iteration": 0, "reward_mean": 0.1, "total_seconds": 2.0}
    assert iteration_line(plain, 3, 2.0) == "iteration 1/3  reward 0.100  2.0 s/it  ETA 4s"
    assert iteration_line({"iteration": 2}, 3, None) == "iteration 3/3"


def test_every_row_is_one_line_even_when_several_land_between_polls(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(row(0, 0.5, 100.0))  # an earlier run's row (a resume appends): not this run's
    out: list[str] = []
    lines = PlainLines(tmp_path, 4, out.append)
    lines.update(None)
    assert out == []
    with open(metrics, "a") as f:  # two iterations between polls, and a third half written
        f.write(row(1, 0.2, 2.0) + row(2, 0.3, 4.0, eval={"pass_at_1": 0.25}) + '{"iteration": 3, "rew')
    lines.update(Progress(phase="rollout", iteration=3, iterations=4, updated_at=time.time()))
    assert out == ["iteration 2/4  reward 0.200  2.0 s/it  ETA 4s",
                   "iteration 3/4  reward 0.300  pass@1 0.250  4.0 s/it  ETA 3s"]
    with open(metrics, "a") as f:
        f.write('ard_mean": 0.4, "total_seconds": 3.0}\n')
    lines.update(None)
    assert out[2:] == ["iteration 4/4  reward 0.400  3.0 s/it  ETA 0s"]


def test_the_starting_eval_and_each_note_once_and_not_the_last_runs(tmp_path: Path) -> None:
    out: list[str] = []
    since = time.time()
    lines = PlainLines(tmp_path, 4, out.append, since=since)
    start = EvalSummary(iteration=0, weight_version=1, pass_at_1=0.09, pass_at_k=0.3, k=4, prompts=32)
    old = Progress(phase="done", iteration=4, iterations=4, eval=start, message="old", updated_at=since - 60)
    lines.update(old)  # a resumed run's record until its driver writes
    assert out == []
    waiting = Progress(phase="rollout", eval=start, message="waiting for a healthy rollout", updated_at=since + 1)
    lines.update(waiting)
    lines.update(waiting)
    assert out == ["eval after 0 iterations: pass@1 0.090 pass@4 0.300 on 32 prompts", "waiting for a healthy rollout"]


def test_a_terminal_gets_the_live_table_and_anything_else_plain_lines(tmp_path: Path) -> None:
    job = load_job(EXAMPLES / "tiny-grpo.yaml")
    piped = Console(file=io.StringIO())
    assert not interactive(piped) and interactive(Console(file=io.StringIO(), force_terminal=True))
    live, _ = _display(Console(file=io.StringIO(), force_terminal=True), job, tmp_path, [], started=0.0, since=0.0)
    assert isinstance(live, Live)
    plain, show = _display(piped, job, tmp_path, [], started=0.0, since=0.0)
    assert not isinstance(plain, Live)
    (tmp_path / "metrics.jsonl").write_text(row(0, 0.5, 1.5))
    with plain:
        show(None)
    total = job.spec.algorithm.iterations
    assert piped.file.getvalue().splitlines() == [  # type: ignore[attr-defined]
        f"iteration 1/{total}  reward 0.500  1.5 s/it  ETA {human(int(round((total - 1) * 1.5)))}"]
