"""Start-up of the driver: find the rollout sidecars, and resume from the newest version any copy holds.

Role: rollouts advertise themselves under `keys.endpoint(...)` (lease-bound, each with its gang generation);
`rollout_addresses` / `rollout_pods` list those of the driver's own generation (all, rollout-only or hybrid)
and `wait_for_rollouts` waits until the expected number is there. On resume (every pod the operator starts,
and `tandem run --resume`; TANDEM_RESUME), `resume_point` picks the version to go on from, loads it into the
trainer's engine on every rank (Megatron or transformers + FSDP2; an adapter-only version into the LoRA
adapters) and restores the optimizer (and critic) state beside it (`train_state.restore`); the loop continues
after the iteration that published it. Callers: `..start.create` (`resume_point`, `wait_for_rollouts`,
`rollout_pods`), the rollout sources and the Rollout phase (which rollouts are up now).

Where versions are found on resume, the newest iteration winning: the pod's shared memory (its newest version,
the iteration from the lease-free progress record); the durable store when the job sets
`checkpointEngine.persist` (its newest verified copy, which carries its iteration); and, after a gang restart
in a cluster (which deletes the hybrid pods and their /dev/shm), the rollout-only pods the operator kept through
it ("peers"): each holds the newest version it pulled and registers it again once the dead trainer's records are
gone (`tandem.sidecars.rollout.kept`); the hybrid pods' own rollouts pull it from them over the transport, and
the trainers load it from there. The driver decides and broadcasts the choice; every rank loads it, from the
driver's path or else from its own pod's shm.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Protocol

import httpx

from tandem.checkpoint_engine.etcd import keys
from tandem.checkpoint_engine.etcd.sync_registry import SyncRegistry
from tandem.checkpoint_engine.versions import layout
from tandem.sidecars.trainer.engines.common import EngineError
from tandem.sidecars.trainer.loop.recovery import train_state
from tandem.spec.podenv import PodEnv
from tandem.spec.progress import Progress


class Resumable(train_state.TrainerParts, Protocol):
    """What resuming needs of its caller (`TrainerContext` satisfies it and passes itself in; no import back)."""

    @property
    def env(self) -> PodEnv: ...
    @property
    def registry(self) -> SyncRegistry | None: ...
    @property
    def is_driver(self) -> bool: ...
    def broadcast(self, obj: Any) -> Any: ...


log = logging.getLogger(__name__)


class ResumeError(RuntimeError):
    pass


def rollout_addresses(registry: SyncRegistry, generation: int, rollout_only: bool | None = None) -> list[str]:
    """Addresses of the rollout sidecars of this gang generation that are up now, sorted; with
    `rollout_only` True (False) only those of rollout-only (hybrid) pods.

    A record is bound to its writer's lease, but a killed pod's lease outlives it by its TTL: after
    a gang restart the old generation's records (same keys, dead addresses) may still be there.
    Each rollout writes its `TANDEM_RESTART_GENERATION`; only the driver's own generation counts."""
    return list(rollout_pods(registry, generation, rollout_only))


def rollout_pods(registry: SyncRegistry, generation: int, rollout_only: bool | None = None) -> dict[str, str]:
    """{address: pod} of the rollouts `rollout_addresses` finds (the client names pods in its messages)."""
    prefix = keys.endpoints_prefix(registry.namespace, registry.scope)
    found = {k: v for k, v in registry.list_json(prefix).items()
             if k.endswith("/rollout") and v.get("ready") and v.get("generation", 0) == generation
             and (rollout_only is None or bool(v.get("rolloutOnly", False)) == rollout_only)}
    return {str(found[k]["address"]): str(found[k].get("pod", "")) for k in sorted(found)}


def wait_for_rollouts(registry: SyncRegistry, count: int, generation: int, timeout: float = 600.0) -> list[str]:
    """Addresses of at least `count` rollout sidecars of `generation`, waiting for them to register."""
    deadline = time.monotonic() + timeout
    found: list[str] = []
    while time.monotonic() < deadline:
        found = rollout_addresses(registry, generation)
        if len(found) >= count:
            return found
        time.sleep(0.5)
    raise ResumeError(f"only {len(found)} of {count} rollout sidecars registered in etcd within {timeout:.0f}s")


def resume_point(ctx: Resumable) -> tuple[int, int] | None:
    """Load the newest verified version into the model: (version, first iteration), or None.

    Two places may hold one: this pod's shared memory (a trainer restarted in its pod, or
    `tandem run --resume`) and the durable store (`checkpointEngine.persist`: survives the pods);
    and, after a gang restart, the rollout-only pods kept through it (`_from_peers`). For shm and peers
    the iteration comes from the (lease-free) progress record; a durable copy carries its own. The newer
    iteration wins; must run before the publisher's start-up cleanup, which removes shm versions etcd no
    longer lists. Collective: the driver decides, every rank loads.
    """
    found: tuple[int, int, str] | None = None
    if ctx.is_driver:
        candidates = [c for c in (_from_shm(ctx), _from_durable(ctx)) if c is not None]
        try:  # after a gang restart: what the kept rollout-only pods hold (newer than a durable copy, often)
            peers = _from_peers(ctx)
        except ResumeError as e:
            if not candidates:
                raise
            log.warning("the kept rollout-only pods' version is out of reach (%s): resuming from elsewhere", e)
            peers = None
        candidates += [peers] if peers is not None else []
        if candidates:
            found = max(candidates, key=lambda c: c[1])  # stable: shm first on a tie (already verified there)
            log.info("resuming from version %d (%s) at iteration %d", found[0], found[2], found[1])
    found = ctx.broadcast(found)
    if found is None:
        return None
    version, iteration, path = found
    load_version(ctx, version, Path(path))
    train_state.restore(ctx, version)  # optimizer (and critic) as they were, or afresh if unavailable
    return version, iteration


def _from_shm(ctx: Resumable) -> tuple[int, int, str] | None:
    local = layout.list_versions(ctx.env.shm_dir, ctx.env.job)
    if not local or ctx.registry is None:
        return None
    raw = ctx.registry.get_json(keys.progress(ctx.registry.namespace, ctx.registry.scope))
    p = Progress.model_validate(raw) if raw else Progress()
    newest = local[-1]
    # stopped after publishing iteration p.iteration's weights: that iteration is done
    iteration = p.iteration + (1 if newest > p.weight_version and raw else 0)
    return newest, iteration, str(layout.version_dir(ctx.env.shm_dir, ctx.env.job, newest))


PEER_WAIT_S = 300.0  # for a kept pod to register its version (the dead trainer's lease expires first), and for
# this gang's rollouts to pull it


def _kept_rollouts(registry: SyncRegistry, generation: int) -> list[str]:
    """Pods of rollout-only sidecars alive now that an earlier gang started (they adopt `generation` only once
    this driver writes it, after resuming: `TrainerContext`)."""
    prefix = keys.endpoints_prefix(registry.namespace, registry.scope)
    return sorted(str(v.get("pod", k)) for k, v in registry.list_json(prefix).items()
                  if k.endswith("/rollout") and v.get("rolloutOnly") and int(v.get("generation", 0)) < generation)


def _from_peers(ctx: Resumable) -> tuple[int, int, str] | None:
    """The newest version the rollout-only pods kept through a gang restart hold, pulled into this gang's
    hybrid pods by their own rollouts; (version, first iteration, path in this pod's shm), or None."""
    registry, env = ctx.registry, ctx.env
    if registry is None or env.restart_generation == 0:
        return None
    raw = registry.get_json(keys.progress(registry.namespace, registry.scope))
    kept = _kept_rollouts(registry, env.restart_generation)
    if not raw or not kept:
        return None
    p = Progress.model_validate(raw)
    deadline = time.monotonic() + PEER_WAIT_S
    version = _held_by(registry, kept)
    while version is None and kept and time.monotonic() < deadline:  # the old trainer's lease expires, a kept pod
        time.sleep(1.0)  # registers; a dead pod's record (its lease not yet expired) goes and stops the wait
        kept = _kept_rollouts(registry, env.restart_generation)
        version = _held_by(registry, kept)
    if version is None:
        log.warning("no kept rollout-only pod registered a version%s: starting over",
                    f" within {PEER_WAIT_S:.0f}s ({', '.join(kept)})" if kept else " (none is left)")
        return None
    _pull_into_hybrid_pods(ctx, version, deadline)
    # one version per iteration: the progress record names the version its iteration published
    iteration = max(0, p.iteration + (version - p.weight_version))
    log.info("a gang restart without persist: version %d, held by the kept rollout-only pods %s, continues the job",
             version, ", ".join(kept))
    return version, iteration, str(layout.version_dir(env.shm_dir, env.job, version))


def _held_by(registry: SyncRegistry, pods: list[str]) -> int | None:
    """The latest version when one of `pods` holds it (the dead trainer's own may be listed until its lease
    expires, held by nobody alive), else None."""
    version = registry.latest()
    return version if version is not None and set(registry.holders(version)) & set(pods) else None


def _pull_into_hybrid_pods(ctx: Resumable, version: int, deadline: float) -> None:
    """Every hybrid pod of this gang has `version` in its shm afterwards: its rollout (once up) is asked to load
    it, which pulls it from a holder over the transport first (as any update of a pod that did not publish)."""
    registry, env = ctx.registry, ctx.env
    assert registry is not None
    asked: set[str] = set()
    while len(asked) < env.replicas:
        hybrid = rollout_pods(registry, env.restart_generation, rollout_only=False)
        for address in sorted(set(hybrid) - asked):
            try:
                r = httpx.post(f"http://{address}/update", json={"version": version}, timeout=PEER_WAIT_S,
                               headers={"Authorization": f"Bearer {env.token}"})
            except httpx.HTTPError as e:
                raise ResumeError(f"rollout {hybrid[address]} could not load version {version} to resume from: "
                                  f"{e!r}") from e
            if r.status_code != 200:
                raise ResumeError(f"rollout {hybrid[address]} could not load version {version} to resume from: "
                                  f"HTTP {r.status_code} {r.text[:300]}")
            asked.add(address)
        if len(asked) >= env.replicas:
            return
        if time.monotonic() > deadline:
            raise ResumeError(f"only {len(asked)} of {env.replicas} hybrid pods' rollouts came up within "
                              f"{PEER_WAIT_S:.0f}s to load version {version} to resume from")
        time.sleep(0.5)


def _from_durable(ctx: Resumable) -> tuple[int, int, str] | None:
    got = ctx.durable.latest() if ctx.durable is not None else None
    return None if got is None else (got.version, got.iteration, str(got.path))


def load_version(ctx: Resumable, version: int, path: Path) -> None:
    """Copy version `version` (HF names, at `path`: shm or durable) into the trainer's model.

    A rank in another pod than the driver's may not see `path` (another pod's shm, a volume
    mounted per node); it reads the same version from its own pod's shm, where that pod's
    rollout sidecar pulled it, and says so clearly when neither is there. An adapter-only version
    (trainer.lora.sync adapter) sets the adapters over the base model's own weights.
    """
    if not (path / layout.INDEX).exists():
        path = layout.version_dir(ctx.env.shm_dir, ctx.env.job, version)
        if not (path / layout.INDEX).exists():
            raise ResumeError(f"version {version} to resume from is neither at {path} nor in this pod's shm")
    mapped = layout.MappedVersion(path)
    mapped.verify_checksums()
    tensors = dict(mapped.tensors())
    if mapped.index.adapter is None:
        ctx.engine.load_hf_weights(tensors.__getitem__)
        return
    try:
        ctx.engine.load_adapter_version(tensors.__getitem__)  # the hf engine with trainer.lora
    except EngineError as e:
        raise ResumeError(f"version {version} at {path} holds LoRA adapters only; this trainer has no adapters "
                          f"(trainer.lora) to load them into: {e}") from e
