"""Keeps the operator's log about changes: kopf's line for every routine handler success is dropped.

Caller: `tandem.operator.__main__` (unless --verbose). kopf logs "<handler> succeeded." at INFO
after every handler run. Two of ours run all the time: the level-triggered `reconcile_job` timer
(each job, every TANDEM_RECONCILE_INTERVAL seconds: 50 lines a second for 100 jobs at the chart's
2 s) and the `job_pods` indexer (every event of every job's pods). Their success lines were most of
the log and said nothing; failures, retries, our own messages and every other handler's lines stay.
"""

from __future__ import annotations

import logging

KOPF_OBJECTS = "kopf.objects"  # the logger kopf's per-object log lines go through


class RoutineSuccessFilter(logging.Filter):
    def __init__(self, handler_names: list[str]) -> None:
        """`handler_names`: kopf's names of the routine handlers, e.g. "Timer 'reconcile_job'"."""
        super().__init__()
        self.lines = frozenset(f"{name} succeeded." for name in handler_names)

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno == logging.INFO and record.getMessage() in self.lines)


def routine_handlers() -> list[str]:
    """kopf's names of our always-running handlers (kopf names a handler by its function's name)."""
    from tandem.operator.runtime import handlers

    return [f"Timer {handlers.reconcile_job.__name__!r}", f"Indexer {handlers.job_pods.__name__!r}"]


def quiet_routine_successes() -> RoutineSuccessFilter:
    """Install the filter on kopf's object logger (idempotent: one filter per process)."""
    logger = logging.getLogger(KOPF_OBJECTS)
    for f in logger.filters:
        if isinstance(f, RoutineSuccessFilter):
            return f
    f = RoutineSuccessFilter(routine_handlers())
    logger.addFilter(f)
    return f
