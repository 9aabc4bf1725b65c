"""Two `tandem run`s of one namespace/name on one machine: the second refuses with one line naming the first.

Both would share the job's shared-memory root (`local.shm_root_of`), and each run's start and end delete it: a
second run of the same name used to remove the first one's version being written, and the first failed with
FileNotFoundError. The holder here is a real process holding the lock (`local.exclusive`); after it is killed
with SIGKILL the kernel has released the lock and a new run may take it.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from tandem.cli import local
from tandem.spec.models import RLHFJob

HOLDER = """
import sys, time
from tandem.cli import local
from tandem.spec.models import RLHFJob
job = RLHFJob.model_validate_json(sys.argv[1])
with local.exclusive(job):
    print("held", flush=True)
    time.sleep(600)
"""


def _job(name: str) -> RLHFJob:
    return RLHFJob.model_validate({"metadata": {"name": name}, "spec": {
        "model": {"path": "/nonexistent-model"}, "dataset": {"path": "d.jsonl"}, "gpusPerPod": 0,
        "rewards": [{"type": "answerMatch"}]}})


def test_a_second_run_of_the_same_job_refuses_and_the_lock_dies_with_its_holder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    job = _job(f"lock-test-{os.getpid()}")
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, job.model_dump_json(by_alias=True)],
                              stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                  sys.path)})
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        out = io.StringIO()
        monkeypatch.setattr(local, "console", Console(file=out, width=400))
        assert local.run_job(job, workdir=tmp_path) == 1
        line = out.getvalue().strip()
        assert "\n" not in line  # one line, no traceback
        assert f"job default/{job.metadata.name} is already running" in line and f"pid {holder.pid}" in line
        assert not (tmp_path / job.metadata.name).exists()  # nothing of the holder's touched, nothing started
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=60)
    deadline = time.monotonic() + 30
    while True:  # the kernel releases a killed holder's lock once its descriptor is closed
        try:
            with local.exclusive(job):
                break
        except local.AlreadyRunning:
            assert time.monotonic() < deadline, "the killed holder's lock was never released"
            time.sleep(0.1)
    lock = local.shm_root_of(job).with_name(local.shm_root_of(job).name + ".lock")
    assert not lock.exists()  # a run leaves nothing in /dev/shm, its lock included
