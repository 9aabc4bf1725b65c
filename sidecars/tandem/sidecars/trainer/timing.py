"""Phase timing for the driver loop: `with timer("train"): ...` accumulates seconds per phase.

Caller: the driver; the totals go into metrics.jsonl (`seconds`) and the etcd progress record.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager


class PhaseTimer:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._t0 = time.perf_counter()

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        t = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - t

    @property
    def total(self) -> float:
        return time.perf_counter() - self._t0

    def share(self, phases: tuple[str, ...]) -> float:
        """Fraction of the wall time spent in `phases`."""
        return sum(self.seconds.get(p, 0.0) for p in phases) / max(self.total, 1e-9)
