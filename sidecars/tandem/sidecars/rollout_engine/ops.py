"""The rollout engine's phases and operations in etcd, for the operator and the driver to read.

Role: every phase the engine enters is published as its status (`keys.engine`), every operation (start,
update, sleep, wake_up, terminate) as a record that goes running -> done or failed, with the error and the
version served after it (`keys.op`). etcd being away is a warning, never the operation's failure.
Caller: `engine.RolloutEngine` (`set_phase`, `_op`).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from tandem.checkpoint_engine import errors
from tandem.checkpoint_engine.etcd.sync_registry import SyncRegistry
from tandem.checkpoint_engine.service.engine_status import EngineStatus

log = logging.getLogger(__name__)


def publish_status(registry: SyncRegistry | None, status: Callable[[], EngineStatus]) -> None:
    """The engine's status in etcd (nothing without a registry)."""
    if registry is None:
        return
    try:
        registry.put_status(status().model_dump(mode="json"))
    except errors.RegistryUnavailable as e:
        log.warning("could not publish status %s: %s", status().phase.value, e)


@contextmanager
def recorded(registry: SyncRegistry | None, kind: str, args: dict[str, Any],
             version: Callable[[], int | None]) -> Iterator[None]:
    """An operation of `kind` recorded in etcd while it runs, then done (with `version()`) or failed."""
    op_id = f"{time.time_ns()}-{kind}-{uuid.uuid4().hex[:6]}"
    rec: dict[str, Any] = {"op": kind, "args": args, "state": "running", "started": time.time()}
    _put(registry, op_id, rec)
    try:
        yield
    except Exception as e:
        rec.update(state="failed", error=f"{type(e).__name__}: {e}", finished=time.time())
        _put(registry, op_id, rec)
        raise
    rec.update(state="done", finished=time.time(), version=version())
    _put(registry, op_id, rec)


def _put(registry: SyncRegistry | None, op_id: str, rec: dict[str, Any]) -> None:
    if registry is None:
        return
    try:
        registry.put_op(op_id, rec)
    except errors.RegistryUnavailable as e:
        log.warning("could not publish operation %s: %s", op_id, e)
