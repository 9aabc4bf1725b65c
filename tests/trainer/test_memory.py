"""Per-phase memory of the trainer (`memory.PhaseMemory`) and handing freed memory back (`memory.release`).

Real allocations in this process: a phase's peak sees a transient allocation freed before the phase
ends, the peak is reset between phases, and memory freed in the middle of glibc's heap (small tensors
below a live one, which free() alone never returns) leaves the resident set after `release()`.
"""

from __future__ import annotations

import pytest
import torch

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
