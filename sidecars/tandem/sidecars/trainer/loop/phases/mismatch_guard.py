"""The drift guard (`algorithm.mismatchGuard`): what the loop does when the rollouts and the trainer disagree.

Role: `Guard.observe` is the decision, a pure function of the iterations' metrics: an iteration whose
metric (`mismatch_kl`, or `mismatch_mean`, both measured on the model's tokens before the update) exceeds
the threshold extends a streak, any other iteration (under it, or without a measurement) ends it, and a
streak of `iterations` fires the action, again on every further iteration over the threshold. `enforce`
carries a verdict out on every trainer rank alike (the driver decides, the others learn it by a host
broadcast): warn logs it and the job's status shows it (condition MismatchGuard, an Event); fail raises
`MismatchGuardTripped`, whose one line the driver reports as the job's failure; pause stops before the
update is published, reports phase `paused` with the reason, and holds the pods, for their logs and
metrics, until the job is suspended (`spec.suspend`: the next gang resumes from the newest durable copy,
the streak starts again) or deleted; after PAUSE_LIMIT (less than a day, the other ranks' host wait) the
job fails saying so. Callers: `driver.run` (after the train phase), tests/trainer/test_mismatch_guard.py.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from tandem.spec.rollout_correction import MismatchGuard as GuardSpec

log = logging.getLogger(__name__)
PAUSE_LIMIT = 23 * 3600.0  # seconds a pause holds the pods; the other ranks wait a day on the host
Action = Literal["ok", "warn", "pause", "fail"]


class MismatchGuardTripped(RuntimeError):
    """algorithm.mismatchGuard ended the run (action fail, or a pause that outlasted PAUSE_LIMIT)."""


@dataclass(frozen=True)
class Verdict:
    action: Action
    message: str = ""  # one line: the metric, its value, the threshold, the iterations, the action
    streak: int = 0  # consecutive iterations over the threshold, this one included

    def row(self) -> dict[str, Any]:
        """The metrics row's `mismatch_guard` entry."""
        return {"action": self.action, "streak": self.streak} | ({"message": self.message} if self.message else {})


class Guard:
    def __init__(self, spec: GuardSpec) -> None:
        self.spec = spec
        self.streak = 0
        self.first = -1  # the first iteration of the current streak

    def observe(self, iteration: int, metrics: Mapping[str, Any]) -> Verdict:
        """This iteration's verdict from its metrics row (`spec.key`)."""
        value = metrics.get(self.spec.key)
        if not isinstance(value, int | float) or not value > self.spec.threshold:
            self.streak = 0
            return Verdict("ok")
        if self.streak == 0:
            self.first = iteration
        self.streak += 1
        if self.streak < self.spec.iterations:
            return Verdict("ok", streak=self.streak)
        span = f"iteration {iteration}" if self.first == iteration else f"iterations {self.first}-{iteration}"
        message = (f"algorithm.mismatchGuard: {self.spec.key} {value:.3g} > {self.spec.threshold:g} in "
                   f"{self.streak} consecutive iterations ({span}); action {self.spec.action}")
        return Verdict(self.spec.action, message, self.streak)


class Loop(Protocol):
    """What `enforce` needs of the trainer context."""

    @property
    def is_driver(self) -> bool: ...

    def broadcast(self, obj: Any) -> Any: ...


class Report(Protocol):
    """The loop's phase report (`report.report` bound to the context)."""

    def __call__(self, phase: Any, iteration: int, version: int, *, reward: float | None = None,
                 message: str = "") -> None: ...


def enforce(ctx: Loop, guard: Guard | None, iteration: int, version: int, info: dict[str, Any], *,
            report: Report, record: Callable[[], None] = lambda: None, sleep: Callable[[float], None] = time.sleep,
            limit: float = PAUSE_LIMIT) -> Verdict:
    """Judge the iteration on the driver, tell every rank, act (collective: every rank calls it when the
    job has a guard). Returns the verdict; its line is also in `info["mismatch_guard"]`. Before a pause or
    a failure, `record` writes the iteration's metrics row (the loop stops before its usual record); a
    pause is reported (phase `paused`, with the reason) through `report`."""
    verdict = guard.observe(iteration, info) if guard is not None and ctx.is_driver else None
    verdict = ctx.broadcast(verdict)
    if not isinstance(verdict, Verdict):
        return Verdict("ok")
    if verdict.streak:
        info["mismatch_guard"] = verdict.row()
    if verdict.action in ("ok", "warn"):
        if verdict.action == "warn" and ctx.is_driver:
            log.warning("%s", verdict.message)
        return verdict
    record()
    if verdict.action == "fail":
        raise MismatchGuardTripped(verdict.message)
    reason = (f"paused: {verdict.message}; the update was not published. spec.suspend: true frees the pods (the "
              f"next gang resumes from the newest durable copy); the job fails after {limit / 3600:g} h paused")
    report("paused", iteration, version, reward=info.get("reward_mean"), message=reason)
    if ctx.is_driver:
        log.warning("%s", reason)
        waited = 0.0
        while waited < limit:  # the pods stay for inspection until suspended or deleted
            step = min(60.0, limit - waited)
            sleep(step)
            waited += step
    ctx.broadcast(None)  # the other ranks wait here, on the host, for the driver
    raise MismatchGuardTripped(f"{verdict.message}; paused {limit / 3600:g} h without being suspended")
