"""Start-up of the driver: find the rollout sidecars, and resume from the last published version.

Role: rollouts advertise themselves under `keys.endpoint(...)` (lease-bound); the driver waits
until the expected number is there. On resume (a restarted gang or `tandem run --resume`), the
newest complete version in etcd is read back from shared memory into the Megatron model and
the loop continues after the iteration that produced it. Caller: `TrainerContext`.
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


def wait_for_rollouts(registry: SyncRegistry, count: int, timeout: float = 600.0) -> list[str]:
    """Addresses of `count` rollout sidecars (their own pods' first), waiting for them to register."""
    prefix = keys.endpoints_prefix(registry.namespace, registry.job)
    deadline = time.monotonic() + timeout
    found: dict[str, str] = {}
    while time.monotonic() < deadline:
        found = {k: str(v["address"]) for k, v in registry.list_json(prefix).items()
                 if k.endswith("/rollout") and v.get("ready")}
        if len(found) >= count:
            return [found[k] for k in sorted(found)]
        time.sleep(0.5)
    raise ResumeError(f"only {len(found)} of {count} rollout sidecars registered in etcd within {timeout:.0f}s")


def latest_state(ctx: TrainerContext) -> tuple[int, int] | None:
    """(version, first iteration to run) after loading the newest published weights, or None."""
    if ctx.registry is None:  # non-driver ranks learn the answer from the driver
        return ctx.broadcast(None)  # type: ignore[no-any-return]
    latest = ctx.registry.latest()
    result: tuple[int, int] | None = None
    if latest is not None:
        raw = ctx.registry.get_json(keys.progress(ctx.env.namespace, ctx.env.job))
        p = Progress.model_validate(raw) if raw else Progress()
        # stopped after publishing iteration p.iteration's weights: that iteration is done
        result = (latest, p.iteration + (1 if latest > p.weight_version and raw else 0))
    result = ctx.broadcast(result)
    if result is not None:
        load_version(ctx, result[0])
    return result


def load_version(ctx: TrainerContext, version: int) -> None:
    """Copy version `version` (HF names, in this pod's shm) into the Megatron model."""
    from tandem.sidecars.trainer import megatron_build

    mapped = layout.MappedVersion(layout.version_dir(ctx.env.shm_dir, ctx.env.job, version))
    mapped.verify_checksums()
    tensors = dict(mapped.tensors())
    megatron_build.load_hf_weights(ctx.engine.gpt, tensors.__getitem__, ctx.engine.shape, ctx.engine.par)
