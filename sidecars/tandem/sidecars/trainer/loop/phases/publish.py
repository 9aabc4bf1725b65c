"""What happens to a new weight version: Publish → [Persist, Export] → ... → Sync.

Role: `publish` exports the policy's weights in HF layout from every rank (with trainer.lora.sync adapter the
adapters alone) and the driver writes them to shared memory and registers them in etcd; `persist`
(checkpointEngine.persist, when due) has every rank write its training state now and the driver copy the
weights in the background; `export` (spec.export, when due) writes the published version as a HF directory;
`sync` has every rollout load the version (restarting or waking vLLM first, as rollout.betweenRollouts
released it). Caller: `driver.run`, and `start.start_version` for the starting weights.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from tandem.sidecars.trainer.loop.recovery import persist as persisting
from tandem.sidecars.trainer.loop.recovery import train_state
from tandem.spec import devices

if TYPE_CHECKING:
    from tandem.sidecars.trainer.loop.context import TrainerContext

log = logging.getLogger(__name__)


def publish(ctx: TrainerContext, version: int | None) -> int:
    """Export HF weights from every rank (with trainer.lora.sync adapter the adapters alone); the driver
    writes them to shm and registers them."""
    dtype = getattr(torch, devices.trainer_dtype(ctx.job.spec))  # the rollout's check wants exactly it
    adapter: dict[str, Any] | None = None
    if devices.adapter_sync(ctx.job.spec):
        exported = ctx.engine.export_adapters()
        adapter = ctx.engine.adapter_config()
    else:
        exported = ctx.engine.export_hf(target_tp=1, target_rank=0)
    named = ((n, t if t.dtype == dtype else t.to(dtype)) for n, t in exported)
    if ctx.publisher is None:
        for _ in named:  # collective: non-driver ranks take part in the gathers
            pass
        return -1 if version is None else version
    report = ctx.publisher.publish(version, named, adapter=adapter)
    ctx.last_publish_path, ctx.last_publish_bytes = Path(report.path), report.bytes
    return report.version


def persist(ctx: TrainerContext, iteration: int, version: int) -> dict[str, Any]:
    """If a durable copy is due after `iteration`: every rank writes its training state (now),
    then the driver starts copying the weights of `version` (in the background)."""
    spec = ctx.job.spec.checkpoint_engine.persist
    if ctx.durable is None or spec is None or not persisting.due(iteration + 1, spec.every,
                                                                 ctx.job.spec.algorithm.iterations):
        return {}
    info = train_state.save(ctx, version)
    if ctx.persister is not None:
        info |= ctx.persister.after_publish(iteration, version)
    return info


def export(ctx: TrainerContext, iteration: int, version: int) -> dict[str, Any]:
    """spec.export: after every `every`-th iteration and the last, the published version as a HF directory."""
    spec = ctx.job.spec.export
    done = iteration + 1
    if spec is None or ctx.last_publish_path is None or not persisting.due(done, spec.every,
                                                                            ctx.job.spec.algorithm.iterations):
        return {}
    from tandem.checkpoint_engine.versions.hf_export import export_version

    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    t = time.perf_counter()
    target = export_version(ctx.last_publish_path, Path(ctx.job.spec.model.path),
                            Path(spec.path) / f"iteration-{done}", dtype=dtypes.get(spec.dtype))
    adapter: Path | None = target / "adapter"
    if not (target / "adapter").is_dir():  # an adapter version exports its adapters itself
        write_adapter = getattr(ctx.engine, "write_adapter", None)  # trainer.lora merged: the adapters too
        adapter = write_adapter(target / "adapter") if write_adapter is not None else None
    log.info("exported version %d (after %d iterations) to %s%s", version, done, target,
             f" (PEFT adapter in {adapter})" if adapter is not None else "")
    row = {"path": str(target), "version": version, "seconds": time.perf_counter() - t}
    return {"export": row | ({"adapter": str(adapter)} if adapter is not None else {})}


def sync(ctx: TrainerContext, version: int, initial: bool = False, load: bool = True) -> float:
    """Every rollout loads `version` (restarting vLLM first if it was terminated); with `load`
    False (shared asynchronous rollouts load it themselves) only the driver's view moves."""
    if ctx.rollouts is None:
        return 0.0
    if not load:
        ctx.version = version
        return 0.0
    t = time.perf_counter()
    mode = ctx.job.spec.rollout.between_rollouts
    if mode == "terminate" and not initial:
        ctx.rollouts.start(ctx.job.spec.model.path, dummy=True)
    elif mode == "sleep" and not initial:
        ctx.rollouts.wake_up()
    ctx.rollouts.update(version)
    ctx.version = version
    ctx.last_sync = time.perf_counter() - t
    return ctx.last_sync
