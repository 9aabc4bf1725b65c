"""End to end: rollouts fail the way they do on a cluster, and the job finishes every iteration without a restart.

`tandem run` of the toy job with one hybrid pod and two rollout-only pods (real etcd, three real vLLM engines,
megatron-core), failurePolicy.rolloutStallSeconds at its default, 120 s: the ceiling. After the first iteration,
`chaos.Chaos` (the same injector as bench/chaos.py) does to the vLLM processes what an OOM kill, an Xid error or a
hung GPU does:
1. pod 1: its engine stopped (SIGSTOP of the engine core and its worker), then, once a call into it is open
   (an update or a generate waiting on the stopped engine), kill -9 of the engine core: killed mid-call;
2. pod 2: kill -9 of its engine core while a generation step is open (mid-generate);
3. pod 0 (the hybrid pod, whose trainer is untouched): its engine stopped during a step for up to the ceiling
   (a hang), once the steps it served have set its deadline (past its warm-up calls), which its supervisor
   cuts at that deadline (stall_deadline.py). Before the engines killed are back, no rollout may be healthy
   for a while: the driver then waits for one until the first restarted engine is back at the current version.
One run asserts what the issue's proof asks, folded: every iteration ran once, in order, with consecutive
versions; each iteration's samples came from
the version published just before it (on-policy: the version check drops a stale rollout); the driver
dropped the rollouts, re-sent the killed generation's prompts, and re-admitted them; each sidecar
began restarting its engine and logged why (one restart completed, re-admitted); the hang was cut at its
deadline at the job's pace, well below the ceiling (and not at the HTTP timeout), the message naming how the
deadline was derived; the iterations' rows count the engine restarts and a recovery (failure to first
generation) of positive seconds; no job restart happened; and nothing was left running or in shared memory.
Every wait has its own deadline inside pytest's timeout (RUN_S + STOP_S + JOIN_S, checked against it first): a
stuck one fails naming what it waited for (the injector's step, the run, its stop), not by pytest's kill.
"""

from __future__ import annotations

import datetime
import json
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from test_tandem_run import demo_job, processes_of, remove_shm_dirs, run_cmd, toy  # noqa: F401

sys.path.insert(0, str(Path(__file__).parents[2] / "bench"))
from chaos import Chaos, wait_run  # noqa: E402  (bench/chaos.py: the injector the benchmark uses too)

pytestmark = [pytest.mark.e2e, pytest.mark.vllm, pytest.mark.megatron, pytest.mark.etcd]
ITERATIONS = 10
CEILING_S = 120  # failurePolicy.rolloutStallSeconds's default
RUN_S = 660.0  # the run and every wait of the injector (about 6 minutes on two loaded cores)
STOP_S = 120.0  # after a SIGINT, until tandem run stopped every process it started
JOIN_S = 15.0  # the injector's thread, once the run ended


def test_a_job_survives_rollout_engines_killed_and_hung(
        toy: Path, tmp_path: Path, pytestconfig: pytest.Config) -> None:  # noqa: F811
    limit = float(pytestconfig.getini("timeout") or 0)
    assert not limit or RUN_S + STOP_S + JOIN_S < limit, f"the test's waits outlast pytest's timeout of {limit:.0f}s"
    job = demo_job(toy, "e2e-faults")
    job["spec"]["algorithm"].update(iterations=ITERATIONS, lr=3e-3)
    job["spec"]["rollout"]["promptsPerIteration"] = 12
    job["spec"]["rolloutOnlyReplicas"] = 2
    job["spec"]["failurePolicy"].update(rolloutUnavailableSeconds=300)
    assert "rolloutStallSeconds" not in job["spec"]["failurePolicy"]  # the default ceiling
    runs = tmp_path / "runs"
    run_dir = runs / "e2e-faults"
    chaos = Chaos(run_dir, "e2e-faults", deadline=time.monotonic() + RUN_S)
    printed = tmp_path / "tandem-run.out"  # a file, not a pipe: nothing blocks while the test polls
    with printed.open("w") as sink:
        proc = subprocess.Popen(run_cmd(job, tmp_path), stdout=sink, stderr=subprocess.STDOUT, text=True)
    done = threading.Event()
    injected: list[str] = []
    failures: list[BaseException] = []

    def inject() -> None:
        try:
            chaos.wait_rows(1, done)
            injected.append(chaos.stop_then_kill("e2e-faults-1", done))  # 1: stopped, killed mid-call
            injected.append(chaos.kill_mid_step("e2e-faults-2", done))  # 2: mid-generate
            injected.append(chaos.hang("e2e-faults-0", seconds=CEILING_S, stop=done, during="step",  # 3: hung,
                                           paced_below=CEILING_S))  # once its pace sets the deadline
        except BaseException as e:  # noqa: BLE001 - reported by the test
            failures.append(e)

    injector = threading.Thread(target=inject, daemon=True)
    injector.start()
    try:
        wait_run(proc, RUN_S, failures, "tandem run of the faulted job")  # early when the injector failed
    finally:  # a failed or timed-out test leaves no run behind (SIGINT: tandem run stops its processes)
        done.set()
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(STOP_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                raise TimeoutError(f"tandem run still running {STOP_S:.0f}s after SIGINT") from None
    injector.join(JOIN_S)
    out = printed.read_text()
    assert not injector.is_alive(), f"the injector still waits {JOIN_S:.0f}s after the run: {chaos.log}"
    assert not failures, (failures, chaos.log)  # its TimeoutError names what it waited for
    assert proc.returncode == 0, out[-4000:]
    assert len(injected) == 3, injected
    assert injected[1:] == ["step", "hung"], injected

    rows = chaos.rows()
    assert [r["iteration"] for r in rows] == list(range(ITERATIONS))  # every iteration, once, in order
    published = [r["weight_version"] for r in rows]
    assert published == list(range(published[0], published[0] + ITERATIONS))
    assert [r["rollout_version"] for r in rows[1:]] == published[:-1]  # samples from the version they claim
    for r in rows:
        assert r["completions"] == 12 * job["spec"]["algorithm"]["groupSize"]
    dropped = sum(r.get("rollouts_dropped", 0) for r in rows)
    assert dropped >= 3, [r.get("rollout_faults") for r in rows]
    assert sum(r.get("prompts_resent", 0) for r in rows) >= 1  # the mid-generate kill's prompts went elsewhere
    assert sum(r.get("rollouts_rejoined", 0) for r in rows) >= 1
    assert sum(r.get("rollouts_unavailable_s", 0) for r in rows) > 0  # none healthy for a while: it waited
    causes = " ".join(c for r in rows for c in r.get("rollout_faults", []))
    assert all(f"e2e-faults-{i}" in causes for i in range(3)), causes
    logs = {i: (run_dir / "logs" / f"e2e-faults-{i}-rollout.log").read_text() for i in range(3)}
    for log in logs.values():  # each sidecar saw its engine fail, said why, and began a restart
        assert "vLLM engine failed (" in log and "restarting it (restart 1)" in log, log[-3000:]
    # at least one restart completed and was re-admitted: for a while all three engines were down, and the
    # driver waited for one (below). The others may still be restarting when the last iteration ends (a
    # restart takes 40-90 s on a loaded machine, a toy iteration about 1 s): the job does not wait for them.
    assert sum(log.count("vLLM engine restarted") for log in logs.values()) >= 1
    # the hang was cut at the deadline its steps set, well below the ceiling; the message says how it was derived
    hung = re.search(r"vLLM hung: its (\w+) made no progress for (\d+)s \(deadline (\d+)s: (.*)\)$", logs[0], re.M)
    assert hung is not None, logs[0][-3000:]
    assert hung[1] == "step" and int(hung[3]) < CEILING_S / 4, hung[0]
    assert ("the p99 step" in hung[4] or "the floor" in hung[4]) and f"rolloutStallSeconds {CEILING_S}" in hung[4]
    cut = chaos.cut_s.get("e2e-faults-0")
    assert cut is not None and cut < CEILING_S / 4, chaos.log
    # recovery measured: restarts counted, and a rollout back from a restart served again after positive seconds
    restarts = max(r.get("rollout_restarts", 0) for r in rows)
    recoveries = [r["rollout_recovery_s"] for r in rows if "rollout_recovery_s" in r]
    assert restarts >= 1 and recoveries and all(s > 0 for s in recoveries), [
        (r.get("rollout_restarts"), r.get("rollout_recovery_s")) for r in rows]
    assert any("recovered: a generation completed" in log for log in logs.values())
    assert "a vLLM process died during its step" in logs[2]
    trainer = (run_dir / "logs" / "e2e-faults-0-trainer.log").read_text()
    # whether the driver found no healthy rollout for a while depends on whether pods 1-2 were back by the time
    # pod 0's engine knew its pace (the hang waits for that): the client's wait is tested in test_rollout_client
    every_log = out + "".join(p.read_text() for p in (run_dir / "logs").glob("*.log"))
    assert "survived SIGKILL" not in every_log and "Traceback" not in trainer
    assert (run_dir / "generation").read_text() == "0"  # no restart of the job
    assert not Path("/dev/shm/tandem-default-e2e-faults").exists(), "shared memory left behind"
    assert not processes_of(runs), "processes left running"
    summary = json.dumps({"dropped": dropped, "injected": injected, "hang": hung[0], "hang_cut_s": round(cut, 1),
                          "stop_to_dropped_s": stop_to_dropped(chaos.stopped_at["e2e-faults-0"], trainer),
                          "unavailable_s": sum(r.get("rollouts_unavailable_s", 0) for r in rows),
                          "rollout_restarts": restarts, "rollout_recovery_s": recoveries})
    print(summary)


def stop_to_dropped(stopped_at: float, trainer_log: str) -> float | None:
    """Seconds from the hang's SIGSTOP to the driver's first drop of pod 0 after it (its trainer log's time)."""
    for line in trainer_log.splitlines():
        if "e2e-faults-0" in line and "dropped from the pool" in line:
            at = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            if at >= stopped_at - 1:
                return round(at - stopped_at, 1)
    return None
