"""A rollout whose etcd lease was lost is advertised again (`rollout.advertise`), against a real etcd:
the lease is revoked behind the registry's back, as an expiry would leave it; the keepalive sees it gone,
and the endpoint record is written again under a new lease, where a trainer looking for its rollouts
finds it."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from tandem.checkpoint_engine.etcd import keys
from tandem.sidecars.rollout.advertise import keep_advertised

pytestmark = pytest.mark.etcd


def test_the_endpoint_comes_back_under_a_new_lease(make_registry: Any) -> None:
    rollout, trainer = make_registry("pod0", "rollout", ttl=2), make_registry("pod9", "trainer")
    key = keys.endpoint(rollout.namespace, rollout.scope, "pod0", "rollout")
    rollout.put_json(key, {"address": "10.0.0.1:8000", "ready": True}, lease=True)
    stop = threading.Event()
    calls: list[float] = []

    def advertise() -> None:
        calls.append(time.monotonic())
        rollout.put_json(key, {"address": "10.0.0.1:8000", "ready": True}, lease=True)

    thread = keep_advertised(rollout, advertise, stop)
    try:
        dead = rollout.reg._lease.id
        rollout._run(rollout.reg.etcd.call("revoke", lambda c: c.revoke_lease(dead)))
        deadline = time.monotonic() + 30
        while not calls and time.monotonic() < deadline:  # the keepalive (every ttl/3) sees the lease gone
            time.sleep(0.1)
        assert calls, "the lost lease was never noticed"
        while trainer.get_json(key) is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert trainer.get_json(key) == {"address": "10.0.0.1:8000", "ready": True}
        assert rollout.reg._lease.id != dead and len(calls) == 1
    finally:
        stop.set()
        thread.join(timeout=15)
    assert not thread.is_alive()
