"""`tandem run`'s supervision of its processes: rollouts are restarted, failures read as one line.

Role: on a cluster a rollout that crashes as a process is restarted by the kubelet (the hybrid pod's rollout
is a native sidecar, restartPolicy Always) and a failed rollout-only pod is replaced by the operator, while
the trainer goes on; `RolloutRestarts` does the same for `tandem run`'s local processes, up to
MAX_RESTARTS per container (a crash loop still ends the run). A rollout that refused its input (exit 2) or
found no usable GPU (exit 3) is not restarted: the same input would be refused again. A trainer that exits
ends the run, as its gang would restart on a cluster. `diagnosis` is the one line a failed run ends with:
the driver's own report (it names its pod), else the container that died with the last error line of its
log. Caller: `tandem.cli.local`.
"""

from __future__ import annotations

import re
import signal

from rich.console import Console
from rich.text import Text

from tandem.cli.local_procs import LocalContainer, stop_all
from tandem.spec.progress import Progress

MAX_RESTARTS = 5
NO_RESTART = (2, 3)  # refused its input; no usable GPU
_ERROR = re.compile(r"(ERROR|Error|error|Exception|refus|failed)")


class RolloutRestarts:
    def __init__(self, console: Console) -> None:
        self.console = console

    def restart(self, c: LocalContainer) -> bool:
        """Start rollout container `c` again after it exited with an error; False when it may not be."""
        code = c.exit_code()
        if c.name != "rollout" or code in NO_RESTART or code in (-signal.SIGTERM, 128 + signal.SIGTERM) \
                or c.restarts >= MAX_RESTARTS:
            return False
        stop_all([c], grace=10.0)  # what it left running (vLLM's engine core and workers) goes first
        c.restarts += 1
        self.console.print(Text(f"{c.label} exited with {code}: started again ({c.restarts}/{MAX_RESTARTS}); "
                                f"{last_error(c) or 'no error in its log'}", style="yellow"), highlight=False)
        c.start()
        return True


def last_error(c: LocalContainer) -> str:
    lines = [line.strip() for line in c.tail(60).splitlines() if line.strip()]
    found = [line for line in lines if _ERROR.search(line)]
    return (found or lines or [""])[-1][-300:]


def diagnosis(result: Progress | None, containers: list[LocalContainer]) -> str:
    """One line: which pod and component failed, and why."""
    if result is not None and result.phase == "failed" and result.message:
        return result.message
    dead = [c for c in containers if c.exit_code() not in (None, 0, -signal.SIGTERM, 128 + signal.SIGTERM)]
    for c in dead:
        return f"pod {c.pod}, {c.name}: exited with {c.exit_code()}: {last_error(c)}"
    if result is None:
        return "the driver never reported progress"
    return f"the driver stopped reporting in phase {result.phase} (iteration {result.iteration})"
