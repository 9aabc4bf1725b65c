"""Start-up of the driver: find the rollout sidecars, and resume from the last published version.

Role: rollouts advertise themselves under `keys.endpoint(...)` (lease-bound); the driver waits
until the expected number is there. On resume (a restarted gang or `tandem run --resume`), the
newest complete version in etcd is read back from shared memory into the Megatron model and
the loop continues after the iteration that produced it. Caller: `TrainerContext`.

Limitation: a version lives in the pod's shared memory only; a gang restart in a cluster deletes
the pods (and their /dev/shm), so there it restarts from the initial model at iteration 0.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from tandem.checkpoint_engine import keys, layout
from tandem.checkpoint_engine.sync_registry import SyncRegistry
from tandem.spec.progress import Progress

if TYPE_CHECKING:
    from tandem.sidecars.trainer.context import TrainerContext


class ResumeError(RuntimeError):
    pass


def rollout_addresses(registry: SyncRegistry) -> list[str]:
    """Addresses of the rollout sidecars that are up now (hybrid and rollout-only pods), sorted."""
    prefix = keys.endpoints_prefix(registry.namespace, registry.job)
    found = {k: str(v["address"]) for k, v in registry.list_json(prefix).items()
             if k.endswith("/rollout") and v.get("ready")}
    return [found[k] for k in sorted(found)]


def wait_for_rollouts(registry: SyncRegistry, count: int, timeout: float = 600.0) -> list[str]:
    """Addresses of at least `count` rollout sidecars, waiting for them to register."""
    deadline = time.monotonic() + timeout
    found: list[str] = []
    while time.monotonic() < deadline:
        found = rollout_addresses(registry)
        if len(found) >= count:
            return found
        time.sleep(0.5)
    raise ResumeError(f"only {len(found)} of {count} rollout sidecars registered in etcd within {timeout:.0f}s")


def resume_point(ctx: TrainerContext) -> tuple[int, int] | None:
    """Load the newest complete version in this pod's shm into the model: (version, first iteration).

    Version records in etcd are bound to the writer's lease and vanish with it, so a restarted
    trainer looks at its shared memory, verifies the newest version's checksums, loads it, and
    reads the iteration it belongs to from the (lease-free) progress record. Must run before the
    publisher's start-up cleanup, which removes versions etcd no longer lists. Collective: the
    driver decides, every rank loads.
    """
    found: tuple[int, int] | None = None
    if ctx.is_driver:
        local = layout.list_versions(ctx.env.shm_dir, ctx.env.job)
        if local and ctx.registry is not None:
            raw = ctx.registry.get_json(keys.progress(ctx.env.namespace, ctx.env.job))
            p = Progress.model_validate(raw) if raw else Progress()
            newest = local[-1]
            # stopped after publishing iteration p.iteration's weights: that iteration is done
            found = (newest, p.iteration + (1 if newest > p.weight_version and raw else 0))
    found = ctx.broadcast(found)
    if found is not None:
        load_version(ctx, found[0])
    return found


def load_version(ctx: TrainerContext, version: int) -> None:
    """Copy version `version` (HF names, in this pod's shm) into the Megatron model."""
    from tandem.sidecars.trainer import megatron_build

    mapped = layout.MappedVersion(layout.version_dir(ctx.env.shm_dir, ctx.env.job, version))
    mapped.verify_checksums()
    tensors = dict(mapped.tensors())
    megatron_build.load_hf_weights(ctx.engine.gpt, tensors.__getitem__, ctx.engine.shape, ctx.engine.par)
