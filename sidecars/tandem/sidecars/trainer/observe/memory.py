"""Memory of the trainer process per phase, and freed memory handed back to the kernel.

Role: the driver's `PhaseTimer` measures each phase of an iteration through `PhaseMemory.measure`:
the peak resident set the kernel saw during the phase (VmHWM, reset before the phase by writing 5
to /proc/self/clear_refs), the resident set after it, and on a GPU the peak of torch's allocator
(`torch.cuda.max_memory_allocated`, reset per phase). After each phase `release()` runs the garbage
collector and glibc's `malloc_trim(0)`, which returns the free pages of every malloc arena to the
kernel (without it, glibc keeps what a train step freed in its heaps, and the RSS the kernel sees —
and the OOM killer acts on — climbs with every iteration whose tensors are shaped differently).
Only the phases that free what they allocated are followed by a release (`FREEING`: a phase that moves
nothing in this process, such as a CPU pod's onload, costs nothing), and the driver ends start-up with
`tandem.sidecars.startup.freeze_start_up`, so a release's collection walks only what the loop allocated
(SmolLM2's trainer: 0.21 s per collection before, under a millisecond after, which was 0.3 s on every phase
of every iteration).
The numbers go into metrics.jsonl (`memory`), Prometheus and the run summary; `bench/memory.py`
reads them. Caller: `driver.run` (through `PhaseTimer`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

MIB = float(1 << 20)
_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _libc() -> Any | None:
    name = ctypes.util.find_library("c")
    try:
        lib = ctypes.CDLL(name or "libc.so.6")
    except OSError:
        return None
    return lib if hasattr(lib, "malloc_trim") else None  # glibc only (not musl)


_LIBC = _libc()


def status_kib(field: str) -> int | None:
    """A `kB` field of /proc/self/status (VmRSS, VmHWM, RssAnon, ...), None where there is none."""
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def reset_peak() -> bool:
    """Reset the kernel's peak RSS of this process (VmHWM) to its current RSS; False where refused."""
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return True


FREEING = ("rollout", "inference", "train", "publish", "persist", "export", "eval")
"""The driver's phases that free memory of this process (samples, activations, exported tensors)."""


def release() -> bool:
    """Collect garbage and give the allocator's free memory back (glibc malloc_trim; on a GPU, torch's
    cached blocks). Returns whether malloc_trim was available."""
    gc.collect()
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    if _LIBC is None:
        return False
    _LIBC.malloc_trim(0)
    return True


class PhaseMemory:
    """Peak and resident memory per phase of one iteration, in MiB; after each phase in `releasing` (every
    phase when None), freed memory is handed back (`release`)."""

    def __init__(self, trim: bool = True, releasing: tuple[str, ...] | None = None) -> None:
        self.trim, self.releasing = trim, releasing
        self.phases: dict[str, dict[str, float]] = {}
        self.can_reset = reset_peak()
        import torch

        self._cuda = torch.cuda.is_available()

    @contextmanager
    def measure(self, phase: str) -> Iterator[None]:
        import torch

        reset_peak()
        if self._cuda:
            torch.cuda.reset_peak_memory_stats()
        try:
            yield
        finally:
            peak = status_kib("VmHWM")
            if self.trim and (self.releasing is None or phase in self.releasing):
                release()
            row = self.phases.setdefault(phase, {})
            if peak is not None:
                row["peak_rss_mib"] = max(row.get("peak_rss_mib", 0.0), peak / 1024)
            rss = status_kib("VmRSS")
            if rss is not None:
                row["rss_mib"] = rss / 1024
            if self._cuda:
                row["cuda_peak_mib"] = max(row.get("cuda_peak_mib", 0.0), torch.cuda.max_memory_allocated() / MIB)
                row["cuda_reserved_mib"] = torch.cuda.memory_reserved() / MIB

    def summary(self) -> dict[str, Any]:
        """`{"peak_rss_mib": max over phases, "phases": {phase: {...}}}` for metrics.jsonl."""
        peaks = [row["peak_rss_mib"] for row in self.phases.values() if "peak_rss_mib" in row]
        out: dict[str, Any] = {"phases": {k: dict(v) for k, v in self.phases.items()}}
        if peaks:
            out["peak_rss_mib"] = max(peaks)
        cuda = [row["cuda_peak_mib"] for row in self.phases.values() if "cuda_peak_mib" in row]
        if cuda:
            out["cuda_peak_mib"] = max(cuda)
        return out

