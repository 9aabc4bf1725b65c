"""Session-wide fixtures shared by every test folder (a real etcd server, free ports), how the suite is
split between two workers, and its time per directory.

Also the fixtures of the checkpoint engine's, the rollout engine's and the rollout sidecar's tests against etcd
(`shm_root`, `job`, `make_registry`). Heavier shared fixtures live beside their users (tests/operator/conftest.py
starts the Kubernetes control plane; tests/rollout_engine/conftest.py shares one vLLM engine per session).

`make test` runs pytest on two workers (pytest-xdist, scheduled by `group_of`, the longest groups handed
out first: `LONGEST_FIRST`; `TANDEM_TEST_WORKERS=1` runs one process), each pinned to its own share of the
cores (`pytest_configure`): end-to-end runs wait on process start-up and I/O part of the time, and two
side by side on separate cores never make their OpenMP teams wait on each other. `group_of` keeps
together what must not run side by side: the tests of the Kubernetes control plane, in two groups
(`CONTROL_PLANE_GROUPS`: a worker starts one control plane per session for whichever of them it runs); the
rollout engine's (one shared vLLM engine); and in one group, "heavy", what runs programs as the code
sandbox's uid (whose process limit and process list are machine-wide: a fork bomb in one test would starve
another's sandbox) together with the runs that take most memory (HEAVY: three vLLM engines, two trainer pods
or the pretrained model, which the multi-turn tests also load; two of those side by side would not fit in
24 GiB). Every other end-to-end file, and each file of tests/trainer (`PER_FILE`), is a group of its own.
At the end, each test directory's summed seconds and the run's wall time are printed (tests/README.md: the
suite's budget).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tandem.checkpoint_engine.etcd.local_etcd import EtcdNotFound, LocalEtcd, free_port
from tandem.checkpoint_engine.etcd.sync_registry import SyncRegistry
from tandem.cli.local_procs import pod_cpus

__all__ = ["EtcdServer", "free_port"]


ALL_CORES = frozenset(os.sched_getaffinity(0))  # before `pytest_configure` pins an xdist worker to its share
EVERY_CORE_ENV = "TANDEM_TEST_EVERY_CORE"  # the same, for helpers that start many light "pods" (tests/transport)


class EtcdServer(LocalEtcd):
    """The session's etcd; `stop()`/`start()` restart it on the same port and data. It runs on every core, not
    on its worker's share: tests of that worker whose processes busy their core must not starve its answers."""

    def launch(self) -> None:
        super().launch()
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):  # exited at once: `wait_healthy` names its log
                os.sched_setaffinity(self.proc.pid, ALL_CORES)


@pytest.fixture(scope="session")
def etcd_server() -> Iterator[EtcdServer]:
    """A real etcd (Debian's etcd-server) on a free loopback port, private data dir."""
    tmp = Path(tempfile.mkdtemp(prefix="tandem-etcd-"))
    try:
        server = EtcdServer(tmp / "data")
    except EtcdNotFound as e:
        pytest.skip(str(e))
    server.start()
    os.environ.setdefault("TANDEM_TEST_ETCD", server.endpoint)
    yield server
    server.stop()
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
def shm_base() -> Iterator[Path]:
    """A private directory in /dev/shm (the pods' shared memory), removed after the test."""
    base = Path("/dev/shm") / f"tandem-bc-{uuid.uuid4().hex[:8]}"
    base.mkdir()
    yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def shm_root() -> Iterator[Path]:
    """A private root for versions in shared memory (/dev/shm, else the temp dir), removed after the test."""
    import shutil

    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    root = base / f"tandem-test-{uuid.uuid4().hex[:8]}"
    root.mkdir()
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def job() -> str:
    """A fresh job name, so tests sharing the session's etcd never read each other's records."""
    return f"job-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def make_registry(etcd_server: Any, job: str) -> Iterator[Any]:
    """`make(pod, role, ttl, job_name)`: a connected `SyncRegistry` on the session's etcd (namespace "test", the
    test's `job` by default), each closed after the test."""
    made: list[SyncRegistry] = []

    def make(pod: str = "pod0", role: str = "trainer", ttl: int = 5, job_name: str | None = None) -> SyncRegistry:
        reg = SyncRegistry(etcd_server.endpoint, "test", job_name or job, pod, role, ttl=ttl, timeout=2.0).connect()
        made.append(reg)
        return reg

    yield make
    for reg in made:
        try:
            reg.close()
        except Exception:  # noqa: S110 - etcd may be stopped by the test
            pass


SANDBOX = ("tests/sandbox/", "tests/rewards/", "tests/envs/", "tests/e2e/test_multiturn_run.py")
HEAVY = ("tests/e2e/test_rollout_faults.py", "tests/e2e/test_pretrained.py", "tests/e2e/test_two_pods.py",
         "tests/e2e/test_hf_engine_run.py", "tests/e2e/test_multiturn_run.py")
STARTED = time.monotonic()


CONTROL_PLANE_SPLIT = ("tests/operator/test_operator_gang_resume.py",)  # a group (and control plane) of its own
# Directories whose files are groups of their own: no session fixture of theirs is costly to start twice, so their
# files fill the end of the run on whichever worker is free (as one group, the trainer's ~340 s was the last to run
# on a fresh machine, one worker finishing it alone while the other was idle).
PER_FILE = ("tests/trainer/",)


def group_of(nodeid: str) -> str:
    """The worker group of a test (see the module docstring): tests of one group run on one worker."""
    path = nodeid.split("::", 1)[0]
    if path.startswith(SANDBOX + HEAVY):
        return "heavy"
    if path.startswith(("tests/e2e/", *PER_FILE, *CONTROL_PLANE_SPLIT)):
        return path
    return "/".join(path.split("/")[:2])  # tests/<dir>: its session fixtures (the control plane) started once


# Groups in the order two workers take them, longest first (measured, sequential seconds on a fresh machine:
# "heavy" ~1950, the toy runs of test_tandem_run ~1000, the control plane's ~640 in two groups of ~290 and ~350
# seconds, test_rollout_modes ~550, the rollout engine's and the checkpoint engine's ~490 together (the
# checkpoint engine's etcd tests, a short group of their own, are the smaller part), ...; the trainer's files come
# after): xdist hands each worker two groups at the start, so the long poles begin at once and the many short
# groups fill in behind them.
LONGEST_FIRST = ("heavy", "tests/e2e/test_tandem_run.py", "tests/operator", *CONTROL_PLANE_SPLIT,
                 "tests/e2e/test_rollout_modes.py", "tests/rollout_engine",
                 "tests/e2e/test_distillation_run.py", "tests/e2e/test_kto_run.py")
CONTROL_PLANE_GROUPS = ("tests/operator", *CONTROL_PLANE_SPLIT)


def group_rank(group: str) -> int:
    """A group's place in `LONGEST_FIRST`; unlisted groups come after the listed ones."""
    return LONGEST_FIRST.index(group) if group in LONGEST_FIRST else len(LONGEST_FIRST)


def control_plane_building() -> bool:
    """Whether scripts/test.sh's build of the control plane is still going on (TANDEM_K8S_BUILD_RC names the file
    it writes its exit status to when it ends; unset where the binaries were there already)."""
    rc_file = os.environ.get("TANDEM_K8S_BUILD_RC")
    return bool(rc_file) and not os.path.exists(rc_file)


def pytest_configure(config: pytest.Config) -> None:
    """On an xdist worker, its own share of the cores (`pod_cpus`: one core each of two), inherited by everything
    its tests start; TANDEM_TEST_PIN=0 leaves every worker on every core. Measured (tests/README.md): two
    SmolLM2 runs side by side took 327 and 324 s unpinned, 142 and 193 s pinned (96 s alone on both cores).
    Unpinned, each run's trainer and vLLM start an OpenMP thread per core, and four busy-waiting teams
    time-slicing two cores wait on each other's preempted threads at every parallel region."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if worker is None or count is None or os.environ.get("TANDEM_TEST_PIN", "1") == "0":
        return
    workers = [f"gw{i}" for i in range(int(count))]
    os.environ[EVERY_CORE_ENV] = ",".join(str(c) for c in sorted(ALL_CORES))
    os.sched_setaffinity(0, pod_cpus(workers, sorted(ALL_CORES))[worker])


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """On an xdist worker, the collection in `LONGEST_FIRST` order (test.sh turns xdist's own reordering by test count
    off); one process keeps the files' order."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return
    items.sort(key=lambda item: group_rank(group_of(item.nodeid)))


try:
    from xdist.scheduler import LoadScopeScheduling
except ImportError:  # one process (a GPU machine without xdist): nothing to schedule
    pass
else:
    class GroupScheduling(LoadScopeScheduling):  # type: ignore[misc]
        """xdist's scope scheduling with `group_of` as the scope (its xdist_group marks are not applied under
        this pytest: the node ids they rewrite are not the ones scheduled)."""

        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            """The next group in order, except that the control plane's wait while it is being built (a fresh
            machine): a worker given one would wait for the build with every other group still to run. Once only
            they are left, the next is given all the same (its fixture waits for the build)."""
            if control_plane_building():
                ready = next((g for g in self.workqueue if g not in CONTROL_PLANE_GROUPS), None)
                if ready is not None:
                    self.workqueue.move_to_end(ready, last=False)
            super()._assign_work_unit(node)

    def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> GroupScheduling:
        return GroupScheduling(config, log)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Seconds per test directory (setup, call and teardown summed, over every worker) and the wall time."""
    per_dir: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for reports in terminalreporter.stats.values():
        for r in reports:
            nodeid, duration = getattr(r, "nodeid", ""), getattr(r, "duration", None)
            if not nodeid or duration is None:
                continue
            folder = "/".join(nodeid.split("::", 1)[0].split("@", 1)[0].split("/")[:2])
            per_dir[folder] += float(duration)
            counts[folder] += getattr(r, "when", "") == "call"
    if not per_dir:
        return
    terminalreporter.write_sep("=", "seconds per test directory (summed over workers)")
    for folder, seconds in sorted(per_dir.items(), key=lambda kv: -kv[1]):
        terminalreporter.write_line(f"{seconds:8.0f} s  {counts[folder]:5d} tests  {folder}")
    terminalreporter.write_line(f"{sum(per_dir.values()):8.0f} s  in all; wall time {time.monotonic() - STARTED:.0f} s")
