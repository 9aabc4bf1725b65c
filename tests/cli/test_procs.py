"""`tandem run`'s process supervision: stopping a container returns only when every process it
started is gone — a grandchild that ignores SIGTERM (as vLLM's workers can stay behind their
engine core) and one orphaned by its parent's exit included. A pinned container (`tandem run
--pin-pods`) and its children run on its cores only. Real processes, no mocks."""

from __future__ import annotations

import os
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tandem.cli.local_procs import LocalContainer, pod_cpus, session_members, stop_all

# the leader starts a grandchild that ignores SIGTERM, prints both pids, and exits on SIGTERM
LEADER = textwrap.dedent("""
    import subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c",
        "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ready', flush=True); time.sleep(600)"], stdout=subprocess.PIPE)
    child.stdout.readline()
    print(child.pid, flush=True)
    time.sleep(600)
""")

# the leader starts a polite grandchild and exits at once: the grandchild is an orphan
ORPHANING = textwrap.dedent("""
    import subprocess, sys
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print(child.pid, flush=True)
""")


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def started(tmp_path: Path, name: str, script: str) -> tuple[LocalContainer, int]:
    c = LocalContainer("pod-0", name, [sys.executable, "-c", script], {}, tmp_path / f"{name}.log")
    c.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        out = c.log_path.read_text().split()
        if out and out[-1].isdigit():
            return c, int(out[-1])
        time.sleep(0.05)
    raise AssertionError(f"{name} did not start: {c.tail()}")


def test_stop_waits_for_a_grandchild_that_ignores_sigterm(tmp_path: Path) -> None:
    c, grandchild = started(tmp_path, "stubborn", LEADER)
    assert alive(grandchild) and grandchild in c.members()
    assert c.proc is not None
    killed = stop_all([c], grace=1.0)
    assert killed == ["pod-0/stubborn"], "SIGKILL only after the grace period"
    assert not alive(grandchild) and not c.members() and c.exit_code() is not None


def test_stop_finds_orphans_of_an_exited_leader(tmp_path: Path) -> None:
    c, orphan = started(tmp_path, "orphaning", ORPHANING)
    assert c.proc is not None
    c.proc.wait()  # the leader is gone, its child lives on in the container's session
    assert alive(orphan) and session_members(c.proc.pid) == [orphan]
    assert stop_all([c], grace=30.0) == [], "SIGTERM was enough"
    assert not alive(orphan)


# the leader starts a child and prints both processes' allowed cores (as "leader;child")
AFFINITY = textwrap.dedent("""
    import os, subprocess, sys
    child = subprocess.run([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                           capture_output=True, text=True).stdout.strip()
    print(f"{sorted(os.sched_getaffinity(0))};{child}".replace(" ", ""), flush=True)
""")


def test_pinned_container_and_its_children_run_on_its_cores_only(tmp_path: Path) -> None:
    cores = sorted(os.sched_getaffinity(0))
    share = pod_cpus(["pod-0", "pod-1"], cores)
    for pod in ("pod-0", "pod-1"):
        c = LocalContainer(pod, "probe", [sys.executable, "-c", AFFINITY], {}, tmp_path / f"{pod}.log",
                           cpus=share[pod])
        c.start()
        assert c.proc is not None and c.proc.wait(60) == 0, c.tail()
        want = str(sorted(share[pod])).replace(" ", "")
        assert c.log_path.read_text().split() == [f"{want};{want}"]


def test_pod_cpus_split_contiguous_and_share_when_short() -> None:
    assert pod_cpus(["a", "b"], [0, 1]) == {"a": {0}, "b": {1}}
    assert pod_cpus(["a", "b"], [0, 1, 2, 3, 4]) == {"a": {0, 1}, "b": {2, 3, 4}}
    assert pod_cpus(["a", "b", "c"], [4, 6]) == {"a": {4}, "b": {6}, "c": {4}}
    assert pod_cpus(["a"], [0, 1]) == {"a": {0, 1}}
    with pytest.raises(ValueError, match="no cores"):
        pod_cpus(["a"], [])
