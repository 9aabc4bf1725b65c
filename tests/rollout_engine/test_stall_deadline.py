"""The deadline at the job's pace (stall_deadline.py), StepWatch's records of it, and the recovery clock.

Pure policy first: the ceiling until a kind of call is warm, then MULTIPLE x the p99 of its recent durations,
at least the floor, at most the ceiling; a reload judged against reloads, not steps. Then `StepWatch` (real
calls timed through `busy`): what it records and what a call that raised leaves out, and the deadline it gives
an open call. Then `Recovery`: the seconds from the first failure found to the next completed generation.
"""

from __future__ import annotations

import threading
import time
from collections import deque

import pytest

from tandem.sidecars.rollout_engine import stall_deadline
from tandem.sidecars.rollout_engine.recovery import Recovery
from tandem.sidecars.rollout_engine.stall_deadline import FLOOR_S, MULTIPLE, WINDOW, deadline, percentile
from tandem.sidecars.rollout_engine.step_watch import StepWatch

CEILING = 120.0


def test_the_ceiling_holds_until_enough_calls_of_that_kind_returned() -> None:
    few_steps = [0.01] * (stall_deadline.WARM["step"] - 1)
    d = deadline("step", few_steps, CEILING)
    assert d.seconds == CEILING and d.capped and "until 16 calls of step" in d.why
    assert deadline("step", few_steps + [0.01], CEILING).seconds < CEILING  # one more: it follows the pace
    assert deadline("reload", [2.0, 2.0], CEILING).seconds == CEILING  # a first large reload never false-alarms
    assert deadline("reload", [2.0, 2.0, 2.0], CEILING).seconds == pytest.approx(MULTIPLE * 2.0)


def test_a_multiple_of_the_p99_of_the_recent_calls() -> None:
    durations = [0.05] * 990 + [0.3] * 10  # the top 1%: prefill chunks
    assert percentile(durations) == pytest.approx(0.05)  # p99 of 1000: the 990th, still a decode step
    recent = durations[-WINDOW:]  # only the window counts: 502 decode steps and the ten chunks
    assert percentile(recent) == pytest.approx(0.3)
    d = deadline("step", durations, CEILING)
    assert d.seconds == pytest.approx(MULTIPLE * 0.3) and not d.capped
    assert d.why == "20x the p99 step of 0.30s"
    assert d.describe(CEILING) == "20x the p99 step of 0.30s; failurePolicy.rolloutStallSeconds 120 caps it"
    old = [9.0] * 100 + [0.3] * WINDOW  # slow calls older than the window no longer set the pace
    assert deadline("step", old, CEILING).seconds == pytest.approx(MULTIPLE * 0.3)


def test_the_floor_and_the_ceiling_bound_it() -> None:
    fast = [0.002] * 200
    d = deadline("step", fast, CEILING)
    assert d.seconds == FLOOR_S and d.why.startswith(f"the floor of {FLOOR_S:.0f}s")
    slow = [10.0] * 200  # 20 x 10 s is over the user's cap
    d = deadline("step", slow, CEILING)
    assert d.seconds == CEILING and d.capped and "failurePolicy.rolloutStallSeconds 120" in d.why
    assert deadline("step", fast, 5.0).seconds == 5.0  # the smallest cap the spec allows: the floor never exceeds it


def test_a_long_prefill_after_many_short_decode_steps_is_within_the_deadline() -> None:
    """Assumption (stall_deadline's docstring): vLLM chunks a prefill to max_num_batched_tokens, and one chunk
    takes under FLOOR_S. A window of 512 decode steps of 10 ms (the prefills aged out) gives the floor, so a
    chunk of 8192 tokens at 0.5 s (a 7B model on one GPU, generously) and the 50x-a-decode-step chunk pass."""
    decode = [0.01] * WINDOW
    d = deadline("step", decode, CEILING)
    assert d.seconds == FLOOR_S
    assert 0.5 < d.seconds and 50 * 0.01 < d.seconds


def test_a_reload_is_judged_against_reloads_not_steps() -> None:
    watch = StepWatch(ceiling_s=CEILING)
    watch._seen["step"] = deque([0.01] * 100, maxlen=WINDOW)
    watch._seen["reload"] = deque([3.0, 4.0, 3.5], maxlen=WINDOW)
    watch._fresh.update(step=100, reload=10)  # past the engine's first calls of each kind
    assert watch.deadline("step").seconds == FLOOR_S
    assert watch.deadline("reload").seconds == pytest.approx(MULTIPLE * 4.0)  # a 30 s reload is no hang
    assert watch.deadline("add adapter").seconds == CEILING  # none seen: the cap


def test_step_watch_records_returned_calls_by_kind_and_leaves_out_the_failed_and_the_first() -> None:
    watch = StepWatch(ceiling_s=30.0)
    warm = stall_deadline.WARM["step"]
    for i in range(2 * warm):
        with watch.busy("step"):
            pass
        if i < warm:  # the engine's first steps: one-time costs, judged against the cap and not recorded
            assert watch.durations("step") == [] and watch.deadline("step").seconds == 30.0
    for _ in range(4):
        with watch.busy("reload"):
            pass
    with pytest.raises(RuntimeError), watch.busy("reload"):
        raise RuntimeError("killed: a hung call fails")
    assert len(watch.durations("step")) == warm and len(watch.durations("reload")) == 1
    assert watch.steps == 2 * warm + 5 and watch.open_call() is None and watch.stalled() is None
    assert watch.deadline("step").seconds == FLOOR_S  # warm: the floor over calls of microseconds
    assert watch.deadline("reload").seconds == 30.0  # one reload recorded: still the cap
    watch.wrap(type("LLMEngine", (), {"step": lambda self: None})())  # a restart: its first calls are cold again
    assert watch.deadline("step").seconds == 30.0 and len(watch.durations("step")) == warm  # the pace is kept
    for _ in range(warm + 1):
        with watch.busy("step"):
            pass
    assert watch.deadline("step").seconds == FLOOR_S and len(watch.durations("step")) == warm + 1


def test_an_open_call_carries_its_age_and_deadline() -> None:
    watch = StepWatch(ceiling_s=60.0)
    for _ in range(40):
        with watch.busy("step"):
            pass
    inside, leave = threading.Event(), threading.Event()

    def hung() -> None:
        with watch.busy("step"):
            inside.set()
            leave.wait(30)

    t = threading.Thread(target=hung)
    t.start()
    try:
        assert inside.wait(10)
        call = watch.open_call()
        assert call is not None and call.what == "step" and call.stalled_s >= 0.0
        assert call.deadline.seconds == FLOOR_S and watch.stalled() == ("step", pytest.approx(call.stalled_s, abs=1))
    finally:
        leave.set()
        t.join()
    assert len(watch.durations("step")) == 25 and watch.open_call() is None


def test_recovery_counts_from_the_first_failure_found_to_the_next_generation() -> None:
    r = Recovery()
    assert r.served(at=5.0) is None and r.recoveries == 0  # serving all along: no recovery
    r.down(at=100.0)
    r.down(at=130.0)  # failed again while restarting: still from the first
    assert r.down_since == 100.0
    assert r.served(at=142.5) == pytest.approx(42.5)
    assert r.recoveries == 1 and r.last_s == pytest.approx(42.5) and r.down_since is None
    assert r.served(at=150.0) is None and r.last_s == pytest.approx(42.5)  # the next generation ends nothing


def test_of_two_open_calls_the_one_nearest_its_deadline_is_judged() -> None:
    """A reload (no reloads seen: the 120 s cap) open since before a step (warm: the floor): the step is the
    call to judge, though the reload opened first."""
    watch = StepWatch(ceiling_s=CEILING)
    for _ in range(40):
        with watch.busy("step"):
            pass
    events = {k: (threading.Event(), threading.Event()) for k in ("reload", "step")}

    def call(what: str) -> None:
        inside, leave = events[what]
        with watch.busy(what):
            inside.set()
            leave.wait(30)

    threads = []
    try:
        for what in ("reload", "step"):
            threads.append(threading.Thread(target=call, args=(what,)))
            threads[-1].start()
            assert events[what][0].wait(10)
        # once the step has been open a 24th of the reload's time it is the nearer to its deadline (judging the
        # oldest call instead, it would never be)
        until = time.monotonic() + 5
        while (call_now := watch.open_call()) is not None and call_now.what != "step" and time.monotonic() < until:
            time.sleep(0.001)
        assert call_now is not None and call_now.what == "step" and call_now.deadline.seconds == FLOOR_S
    finally:
        for _, leave in events.values():
            leave.set()
        for t in threads:
            t.join()
