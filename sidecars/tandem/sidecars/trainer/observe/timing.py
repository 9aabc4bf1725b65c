"""Phase timing for the driver loop: `with timer("train"): ...` accumulates seconds per phase, and
(given a `memory.PhaseMemory`) the phase's peak and resident memory, handing freed memory back after it.

Caller: the driver; the totals go into metrics.jsonl (`seconds`, `memory`) and the etcd progress record.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

from tandem.sidecars.trainer.observe.memory import PhaseMemory


class PhaseTimer:
    def __init__(self, memory: PhaseMemory | None = None) -> None:
        self.seconds: dict[str, float] = {}
        self.memory = memory
        self._t0 = time.perf_counter()

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        t = time.perf_counter()
        try:
            with self.memory.measure(phase) if self.memory is not None else nullcontext():
                yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - t

    @property
    def total(self) -> float:
        return time.perf_counter() - self._t0

    def share(self, phases: tuple[str, ...]) -> float:
        """Fraction of the wall time spent in `phases`."""
        return sum(self.seconds.get(p, 0.0) for p in phases) / max(self.total, 1e-9)
