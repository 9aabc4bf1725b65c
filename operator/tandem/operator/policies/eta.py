"""The status progress block: percent done, iterations per second and the time left (pure).

Callers: `tandem.operator.policies.plan.decide`, with the driver's progress record (`tandem.spec.progress`)
read from etcd on each pass and the block the previous pass wrote.

The record says which iteration the driver has reached and when (`updatedAt`, the driver's own
clock, so the operator's clock and its polling period do not enter the rate). The rate is measured
from a sample kept in the block (iteration, time, restart generation): the first record seen of
the current gang that is past its start-up (phase not `starting`), so model loading does not count
as training time. A new gang generation (a restart or a preemption) or an iteration going back (a
resume from an older durable copy) takes a new sample. Until the driver has moved past the sample's
iteration there is no rate and no ETA.
"""

from __future__ import annotations

from tandem.spec.progress import Progress
from tandem.spec.status import ProgressStatus


def human(seconds: int) -> str:
    """1h05m, 12m30s, 45s, 2d03h: two units at most, as kubectl prints ages."""
    if seconds < 60:
        return f"{seconds}s"
    minutes, secs = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"


def _resampled(prev: ProgressStatus | None, record: Progress, generation: int) -> bool:
    return (
        prev is None
        or prev.rate_since_generation != generation
        or record.iteration < prev.rate_since_iteration
        or prev.rate_since_time <= 0
    )


def progress_block(prev: ProgressStatus | None, record: Progress | None, generation: int) -> ProgressStatus | None:
    """The next block: `prev` as it stands when there is no record; None before any record."""
    if record is None:
        return prev
    total = max(1, record.iterations)
    done = min(record.iteration, total) if record.phase != "done" else total
    block = ProgressStatus(percent=round(100.0 * done / total, 1))
    if record.phase == "done":
        block.eta_seconds, block.eta = 0, human(0)
        if prev is not None:
            block.iterations_per_second = prev.iterations_per_second
        return block
    if _resampled(prev, record, generation) or prev is None:
        if record.phase != "starting":
            block.rate_since_iteration, block.rate_since_time = record.iteration, record.updated_at
            block.rate_since_generation = generation
        else:  # no sample yet: start-up is not training time
            block.rate_since_generation = generation
        return block
    block.rate_since_iteration = prev.rate_since_iteration
    block.rate_since_time = prev.rate_since_time
    block.rate_since_generation = prev.rate_since_generation
    advanced = record.iteration - prev.rate_since_iteration
    elapsed = record.updated_at - prev.rate_since_time
    if advanced > 0 and elapsed > 0:
        rate = advanced / elapsed
        block.iterations_per_second = round(rate, 6)
        left = max(0, total - record.iteration)
        block.eta_seconds = int(round(left / rate))
        block.eta = human(block.eta_seconds)
    return block
