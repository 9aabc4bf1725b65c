"""The operator's log keeps changes, not kopf's success line for every timer pass and pod event.

Unit level, against kopf's own registry and logger: the lines dropped are exactly what kopf writes
after our always-running handlers (`f"{handler} succeeded."`, the handler named by kopf itself);
every other handler's lines, failures and our own messages go through.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import kopf
import pytest

from tandem.operator.runtime import handlers
from tandem.operator.runtime.log_hygiene import KOPF_OBJECTS, RoutineSuccessFilter, quiet_routine_successes


@pytest.fixture
def quiet() -> Iterator[RoutineSuccessFilter]:
    logger = logging.getLogger(KOPF_OBJECTS)
    before = list(logger.filters)
    yield quiet_routine_successes()
    logger.filters[:] = before


def kopf_names() -> tuple[list[str], list[str]]:
    """(always-running handlers: timers and indexers, the others) as kopf names them in its log."""
    registry = kopf.get_default_registry()
    routine = [*registry._spawning.get_all_handlers(), *registry._indexing.get_all_handlers()]
    others = [*registry._changing.get_all_handlers(), *registry._activities.get_all_handlers()]
    assert routine and others, f"handlers of {handlers.__name__} are not registered"
    return [str(h) for h in routine], [str(h) for h in others]


def test_exactly_the_routine_success_lines_are_dropped(
    quiet: RoutineSuccessFilter, caplog: pytest.LogCaptureFixture
) -> None:
    routine, others = kopf_names()
    assert quiet.lines == {f"{name} succeeded." for name in routine}  # a new timer or indexer shows up here
    log = logging.getLogger(KOPF_OBJECTS)
    with caplog.at_level(logging.DEBUG, logger=KOPF_OBJECTS):
        for name in routine:
            log.info("%s succeeded.", name)  # formatted late, as kopf's f-string is not: both must match
            log.info(f"{name} succeeded.")
            log.error(f"{name} failed with an exception. Will retry.")
        for name in others:
            log.info(f"{name} succeeded.")
        log.info("deleted 3 etcd keys of ns/job")
    kept = [r.getMessage() for r in caplog.records]
    assert not any(m.endswith(" succeeded.") and m.removesuffix(" succeeded.") in routine for m in kept)
    assert [f"{n} failed with an exception. Will retry." for n in routine] == [m for m in kept if "failed" in m]
    assert {f"{n} succeeded." for n in others} | {"deleted 3 etcd keys of ns/job"} <= set(kept)


def test_installing_twice_keeps_one_filter(quiet: RoutineSuccessFilter) -> None:
    assert quiet_routine_successes() is quiet
    assert sum(isinstance(f, RoutineSuccessFilter) for f in logging.getLogger(KOPF_OBJECTS).filters) == 1
