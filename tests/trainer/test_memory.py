"""Per-phase memory of the trainer (`memory.PhaseMemory`) and handing freed memory back (`memory.release`).

Real allocations in this process: a phase's peak sees a transient allocation freed before the phase
ends, the peak is reset between phases, and memory freed in the middle of glibc's heap (small tensors
below a live one, which free() alone never returns) leaves the resident set after `release()`.
"""

from __future__ import annotations

import pytest
import torch

from tandem.sidecars import startup
from tandem.sidecars.trainer.observe import memory

pytestmark = pytest.mark.skipif(not memory.reset_peak(), reason="/proc/self/clear_refs refused: no peak reset")


def rss_mib() -> float:
    kib = memory.status_kib("VmRSS")
    assert kib is not None
    return kib / 1024


def test_each_phase_has_its_own_peak() -> None:
    meter = memory.PhaseMemory()
    with meter.measure("warm"):
        pass
    base = rss_mib()
    with meter.measure("big"):
        t = torch.ones(256 << 18)  # 256 MiB, touched
        del t
    with meter.measure("small"):
        pass
    assert meter.phases["big"]["peak_rss_mib"] >= base + 200
    assert meter.phases["big"]["rss_mib"] < base + 100
    assert meter.phases["small"]["peak_rss_mib"] < base + 100  # reset before the phase
    summary = meter.summary()  # the max over phases (in a long test process "warm" may hold the highest:
    # its peak is the RSS at its start, before the release that ends it)
    assert summary["peak_rss_mib"] == max(p["peak_rss_mib"] for p in meter.phases.values())
    assert summary["peak_rss_mib"] >= meter.phases["big"]["peak_rss_mib"]
    assert set(summary["phases"]) == {"warm", "big", "small"}


def test_release_returns_memory_freed_inside_the_heap() -> None:
    memory.release()
    base = rss_mib()
    small = [torch.ones(4096) for _ in range(24_000)]  # 16 KiB each, ~375 MiB from malloc's heap
    keep = torch.ones(4096)  # allocated after them: the heap cannot shrink below it
    del small
    held = rss_mib()
    assert memory.release()
    after = rss_mib()
    assert held - base > 200, (base, held)  # free() kept the pages: the case release() exists for
    assert after - base < 0.3 * (held - base), (base, held, after)
    del keep


def test_only_the_phases_that_free_memory_release_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver's meter hands memory back after the phases in `FREEING` only: a CPU pod's onload,
    offload or release phase moves nothing in the trainer's heap and costs no collection."""
    released: list[str] = []
    meter = memory.PhaseMemory(releasing=memory.FREEING)
    for phase in ("rollout", "release", "onload", "inference", "train", "publish", "offload", "sync", "eval"):
        monkeypatch.setattr(memory, "release", lambda p=phase: released.append(p) or True)
        with meter.measure(phase):
            pass
    assert released == ["rollout", "inference", "train", "publish", "eval"]
    assert set(meter.phases) >= {"onload", "offload", "sync"}  # measured all the same


def test_freeze_leaves_start_up_out_of_later_collections() -> None:
    """After `startup.freeze_start_up()` (the trainer's driver and the rollout sidecar call it) a collection
    walks only what was allocated since: start-up's objects are in the permanent generation, and a reference
    cycle made later is still found and freed."""
    import gc
    import weakref

    class Node:
        def __init__(self) -> None:
            self.me = self

    start_up = [Node() for _ in range(50_000)]  # objects that live for the run
    try:
        startup.freeze_start_up()
        assert gc.get_freeze_count() >= len(start_up)
        later = Node()
        ref = weakref.ref(later)
        del later  # a cycle: only the collector frees it
        assert ref() is not None
        gc.collect()
        assert ref() is None
    finally:
        gc.unfreeze()
        del start_up
