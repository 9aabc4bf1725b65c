"""engine_procs without vLLM: a real process tree that maps a /dev/shm segment (as vLLM's engine
core and workers map their queues) is reaped and its segment unlinked; processes that are not the
engine's (started before it, or an engine never started) are left alone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

from tandem.sidecars.rollout_engine.engine import EngineConfig, RolloutEngine
from tandem.sidecars.rollout_engine.procs import EngineProcesses

# an "engine core" that maps a segment and starts a "worker" that maps it too and ignores SIGTERM
CORE = textwrap.dedent("""
    import mmap, os, subprocess, sys
    name = sys.argv[1]
    fd = os.open("/dev/shm/" + name, os.O_CREAT | os.O_RDWR, 0o600)
    os.ftruncate(fd, 1 << 20)
    m = mmap.mmap(fd, 1 << 20)
    worker = subprocess.Popen([sys.executable, "-c",
        "import mmap, os, signal, sys; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "fd = os.open('/dev/shm/' + sys.argv[1], os.O_RDWR); m = mmap.mmap(fd, 1 << 20); "
        "print('up', flush=True); sys.stdin.read()", name], stdout=subprocess.PIPE, stdin=subprocess.PIPE)
    worker.stdout.readline()
    print("ready", flush=True)
    sys.stdin.read()
""")


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_killed_tree_is_reaped_and_its_segment_unlinked() -> None:
    bystander = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    name = f"tandem-test-seg-{uuid.uuid4().hex[:8]}"
    try:
        procs = EngineProcesses.before_start()
        core = subprocess.Popen([sys.executable, "-c", CORE, name], stdout=subprocess.PIPE, stdin=subprocess.PIPE)
        assert core.stdout is not None and core.stdout.readline() == b"ready\n"
        procs.record()
        assert set(procs.procs) >= {core.pid} and bystander.pid not in procs.procs
        assert len(procs.procs) == 2 and procs.segments == {name}
        pids = list(procs.procs)  # the core and its worker
        os.kill(core.pid, signal.SIGKILL)  # the core dies; its worker stays (ignores SIGTERM, stdin open)
        core.wait()
        assert procs.any_dead()
        assert procs.reap(grace_s=1.0) == [name]
        assert all(gone(pid) for pid in pids) and not Path("/dev/shm", name).exists()
        assert not procs.procs and bystander.poll() is None, "a process that is not the engine's was touched"
    finally:
        bystander.kill()
        bystander.wait()
        Path("/dev/shm", name).unlink(missing_ok=True)


def test_terminating_an_engine_never_started_touches_no_process(tmp_path: Path) -> None:
    bystander = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        engine = RolloutEngine(EngineConfig(shm_root=tmp_path, job="none"))
        engine.terminate()
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()
