"""A sidecar's SIGTERM handling (`tandem.sidecars.startup.exit_on_sigterm` and `leave`), in real child processes
sent real signals: the first SIGTERM runs the `finally` blocks to their end even when a second one follows, and a
SIGTERM that lands while the interpreter runs its exit finalizers (a `tandem run` or kubelet stop as the sidecar
finishes) leaves no traceback in the log. Each child signals what it reached through a file; the test waits for
those files, never for a time. Caller: pytest.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOTS = [str(Path(__file__).resolve().parents[2] / r) for r in ("checkpoint_engine", "operator", "sidecars", "spec")]

# the child's helper: wait until the test creates `name` in the child's folder (a condition, not a time)
PRELUDE = """
import os, pathlib, sys, time, weakref
from tandem.sidecars.startup import exit_on_sigterm, leave
here = pathlib.Path(sys.argv[1])
def reached(name): (here / name).write_text("")
def until(name):
    while not (here / name).exists():
        time.sleep(0.01)
exit_on_sigterm()
"""


def run_child(tmp_path: Path, body: str) -> subprocess.Popen[str]:
    script = tmp_path / "child.py"
    script.write_text(PRELUDE + textwrap.dedent(body))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(ROOTS)}
    return subprocess.Popen([sys.executable, str(script), str(tmp_path)], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def wait_for(path: Path, child: subprocess.Popen[str]) -> None:
    while not path.exists():
        assert child.poll() is None, child.communicate()
        time.sleep(0.01)


def test_a_sigterm_during_the_exit_finalizers_leaves_no_traceback(tmp_path: Path) -> None:
    child = run_child(tmp_path, """
        class Held: pass
        held = Held()
        def finalize():
            reached("finalizing")
            until("go")
        weakref.finalize(held, finalize)
        leave(0)
    """)
    wait_for(tmp_path / "finalizing", child)
    child.send_signal(signal.SIGTERM)
    (tmp_path / "go").write_text("")
    out, err = child.communicate(timeout=60)
    assert child.returncode == 0, err
    assert "Traceback" not in err and "Exception ignored" not in err, err


def test_a_second_sigterm_does_not_break_off_the_first_ones_cleanup(tmp_path: Path) -> None:
    child = run_child(tmp_path, """
        try:
            reached("running")
            until("never")
        finally:
            reached("cleaning")
            until("go")
            reached("cleaned")
    """)
    wait_for(tmp_path / "running", child)
    child.send_signal(signal.SIGTERM)
    wait_for(tmp_path / "cleaning", child)
    child.send_signal(signal.SIGTERM)
    (tmp_path / "go").write_text("")
    out, err = child.communicate(timeout=60)
    assert child.returncode == 128 + signal.SIGTERM, err
    assert (tmp_path / "cleaned").exists(), err
