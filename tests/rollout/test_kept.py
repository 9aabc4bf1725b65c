"""A rollout-only pod kept through a gang restart, against a real etcd and the real TCP transport.

The trainer publishes versions and the kept pod pulls the newest; the trainer's pod dies (its lease goes, and
with it every version record and `latest`): the kept pod registers the version it holds again under its own
lease, a new pod pulls it from the kept one byte for byte (checksums checked), and the kept pod advertises
itself under the generation the new driver writes. A second kept pod that loses the race holds the version too.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
import torch

from tandem.checkpoint_engine.etcd import keys
from tandem.checkpoint_engine.etcd.sync_registry import SyncRegistry
from tandem.checkpoint_engine.service.publisher import Publisher
from tandem.checkpoint_engine.transport import BroadcastNode
from tandem.checkpoint_engine.versions import layout
from tandem.sidecars.rollout.kept import GangFollower

pytestmark = [pytest.mark.etcd]
TOKEN = "test-token"


def tensors(v: int) -> list[tuple[str, torch.Tensor]]:
    return [(f"layer{i}.weight", torch.full((64, 64), float(v * 10 + i))) for i in range(3)]


def test_a_kept_pod_registers_its_version_again_and_follows_the_new_gang(etcd_server: Any, shm_base: Path) -> None:
    shm = shm_base
    job = f"job-{uuid.uuid4().hex[:8]}"
    made: list[SyncRegistry] = []
    nodes: list[BroadcastNode] = []

    def registry(pod: str, role: str) -> SyncRegistry:
        made.append(SyncRegistry(etcd_server.endpoint, "test", job, pod, role, ttl=5, timeout=2.0).connect())
        return made[-1]

    def node(reg: SyncRegistry, pod: str) -> BroadcastNode:
        nodes.append(BroadcastNode(reg, shm / pod, transport="tcp", token=TOKEN).start())
        return nodes[-1]

    try:
        trainer = registry("job-0", "trainer")
        publisher = Publisher(shm / "job-0", job, trainer, keep=2)
        serving = node(trainer, "job-0")
        publisher.publish(1, tensors(1))
        publisher.publish(2, tensors(2))
        kept_reg, other_reg = registry("job-1", "rollout"), registry("job-2", "rollout")
        kept_node, other_node = node(kept_reg, "job-1"), node(other_reg, "job-2")
        assert kept_node.receive(2).version == 2 and other_node.receive(2).version == 2  # both pulled the newest
        endpoint = keys.endpoint(kept_reg.namespace, kept_reg.scope, "job-1", "rollout")
        record: dict[str, Any] = {"address": "127.0.0.1:1", "ready": True, "pod": "job-1", "rolloutOnly": True,
                                  "generation": 0}
        kept_reg.put_json(endpoint, record, lease=True)
        kept = GangFollower(kept_reg, kept_node, shm / "job-1", job, record, endpoint)
        other = GangFollower(other_reg, other_node, shm / "job-2", job, {"generation": 0},
                             keys.endpoint(other_reg.namespace, other_reg.scope, "job-2", "rollout"))

        fresh = GangFollower(other_reg, other_node, shm / "job-2", job, {"generation": 0}, "unused")
        kept.tick()
        other.tick()
        assert kept_reg.latest() == 2 and kept_reg.version_record(2)["holder"] == "job-0"  # the trainer lives: no-op

        serving.close()
        trainer.close()  # the trainer's pod is gone: its lease, records and `latest` with it
        made.remove(trainer)
        assert kept_reg.latest() is None and kept_reg.versions() == []
        # a pod that never saw a version registered (a resumed run's new pod holding old ones) registers nothing
        assert fresh.keep_newest_registered() is None and kept_reg.latest() is None
        assert kept.keep_newest_registered() == 2
        assert other.keep_newest_registered() is None  # another kept pod was first: it holds the version too
        assert kept_reg.latest() == 2 and kept_reg.version_record(2)["holder"] == "job-1"
        assert {"job-1", "job-2"} <= set(kept_reg.holders(2))

        newcomer_reg = registry("job-0", "rollout")  # the new gang's hybrid pod, empty shm
        got = node(newcomer_reg, "job-0b").receive(2)
        assert got.version == 2 and not got.already_here
        pulled = layout.MappedVersion(layout.version_dir(shm / "job-0b", job, 2))
        pulled.verify_checksums()
        assert {n for n, _ in pulled.tensors()} == {n for n, _ in tensors(2)}
        assert all(torch.equal(t, dict(tensors(2))[n]) for n, t in pulled.tensors())

        assert kept.follow_generation() is None  # no newer gang yet
        newcomer_reg.put_json(keys.gang(newcomer_reg.namespace, newcomer_reg.scope), {"generation": 1})
        assert kept.follow_generation() == 1 and kept.follow_generation() is None
        assert kept_reg.get_json(endpoint) == {**record, "generation": 1}  # advertised under the new gang
    finally:
        for n in nodes:
            n.close()
        for reg in made:
            reg.close()
