"""What a restart does with rollouts generated but not trained yet: they are re-generated.

Role: with partial rollouts the driver carries unfinished groups from one iteration to the next;
with asynchronous rollouts batches wait in a queue. Both live in the driver's memory, so a gang
restart or `tandem run --resume` loses them. After publishing each version the driver records in
etcd (lease-free, like the progress record) the dataset indexes of the prompts whose groups are
carried and the next asynchronous batch; on resume from that same version the carried prompts are
generated again from scratch under the resumed weights and the producer starts at that batch, so
no prompt is lost and none trains twice. Resuming from another version (an older durable copy)
finds no matching record and starts afresh: prompts carried then are not re-generated (logged).
Caller: `tandem.sidecars.trainer.loop.driver`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from tandem.checkpoint_engine.etcd import keys
from tandem.checkpoint_engine.etcd.sync_registry import SyncRegistry

log = logging.getLogger(__name__)


@dataclass
class Inflight:
    version: int  # recorded after publishing this version
    prompts: list[int] = field(default_factory=list)  # dataset indexes of carried (partial) groups
    next_batch: int | None = None  # asynchronous: the first batch not trained


def save(registry: SyncRegistry, record: Inflight) -> None:
    registry.put_json(keys.inflight(registry.namespace, registry.scope),
                      {"version": record.version, "prompts": list(record.prompts), "nextBatch": record.next_batch})


def load(registry: SyncRegistry, version: int) -> Inflight | None:
    """The record written with `version`, or None (none, or written with another version)."""
    raw = registry.get_json(keys.inflight(registry.namespace, registry.scope))
    if raw is None:
        return None
    if raw.get("version") != version:
        log.warning("in-flight rollouts were recorded with version %s, resuming from %d: not re-generated",
                    raw.get("version"), version)
        return None
    prompts: Sequence[int] = raw.get("prompts") or []
    nb = raw.get("nextBatch")
    return Inflight(version, [int(i) for i in prompts], None if nb is None else int(nb))
