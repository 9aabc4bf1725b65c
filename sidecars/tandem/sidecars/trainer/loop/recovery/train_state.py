"""The trainer ranks' own state beside each durable weight copy: optimizer (and PPO's critic), per rank.

Role: a durable copy (`checkpoint_engine.versions.durable`) holds the policy's weights in HF layout — all
the rollouts need, not all training needs. Adam's moments and step count, the fp32 master weights
of a bf16 run, and PPO's critic (weights and optimizer) live only in the trainer ranks' memory.
When a durable copy is due, every rank writes its own share beside it:

    <root>/<ns>/<job>/<uid>/train/v<version>/rank-<r:05d>.pt
        {"version", "layout": {world, tp, pp, dp, ep, distributed_optimizer, critic}, "optimizer": state,
         "critic": {"params": {name: tensor}, "optimizer": state} | None}

each file by one atomic rename (`DurableStore.write_train_file`); a state is the optimizer's
`state_dict()`, with Megatron's distributed optimizer (`trainer.distributedOptimizer`) plus this
rank's shard of the moments and master weights, which `state_dict()` leaves out. On resume every
rank looks for its file of the version being resumed; the state is restored only if every rank has
a readable one written under the same parallel layout — data-parallel replicas must never
disagree — otherwise all ranks go on with fresh optimizer state (master weights re-read from the
loaded model) and the log says why. Callers: `publish.persist` (after each due publish, every rank) and
`resume.resume_point` (on resume, every rank).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.distributed as dist

from tandem.sidecars.trainer.engines import common

if TYPE_CHECKING:
    from tandem.checkpoint_engine.versions.durable import DurableStore
    from tandem.sidecars.trainer.engines.interface import TrainerEngine

log = logging.getLogger(__name__)


class TrainerParts(Protocol):
    """What the trainer state needs of its caller: the engines and the durable store.

    `TrainerContext` satisfies it structurally and passes itself in; this module never imports
    the context back (no import cycle).
    """

    @property
    def engine(self) -> TrainerEngine: ...
    @property
    def critic(self) -> TrainerEngine | None: ...
    @property
    def durable(self) -> DurableStore | None: ...


def file_name(rank: int) -> str:
    return f"rank-{rank:05d}.pt"


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def layout_of(ctx: TrainerParts) -> dict[str, int]:
    """What must match between the run that wrote a state and the run that reads it."""
    par = ctx.engine.par
    world = dist.get_world_size() if dist.is_initialized() else 1
    return {"world": world, "tp": par.tp, "pp": par.pp, "dp": par.dp, "ep": par.ep,
            "distributed_optimizer": int(sharded(ctx.engine)), "critic": int(ctx.critic is not None)}


def _optimizer(engine: TrainerEngine) -> Any:
    if engine.optimizer is None:
        raise common.EngineError("a forward-only engine has no training state")
    return engine.optimizer


def sharded(engine: TrainerEngine) -> bool:
    """Whether `engine` trains with Megatron's distributed optimizer (state sharded over the dp ranks)."""
    return bool(getattr(getattr(engine.model, "ddp_config", None), "use_distributed_optimizer", False))


def _parts(optimizer: Any) -> list[Any]:
    """The Megatron optimizers behind `optimizer` (a ChainedOptimizer holds one per parameter kind)."""
    return list(getattr(optimizer, "chained_optimizers", [optimizer]))


def optimizer_state(engine: TrainerEngine) -> Any:
    """This rank's optimizer state. Megatron's distributed optimizer leaves its shard of Adam's moments and
    master weights out of `state_dict()` (megatron writes them separately); here they come with it."""
    optimizer = _optimizer(engine)
    if not sharded(engine):
        return optimizer.state_dict()
    # the fp32 shards may be views into a whole flat buffer, which torch.save would write whole: copies
    return {"shards": [{"common": part.state_dict(), "inner": part.optimizer.state_dict(),
                        "main": [p.detach().clone() for g in part.optimizer.param_groups for p in g["params"]]}
                       for part in _parts(optimizer)]}


def load_optimizer_state(engine: TrainerEngine, state: Any) -> None:
    """Inverse of `optimizer_state`, under the same layout; call after loading the weights it was saved with."""
    optimizer = _optimizer(engine)
    if not sharded(engine):
        optimizer.load_state_dict(state)
        return
    for part, saved in zip(_parts(optimizer), state["shards"], strict=True):
        part.load_state_dict(saved["common"])  # megatron allocates this shard's state (param groups, step)
        part.optimizer.load_state_dict(saved["inner"])  # ... whose moments come from the inner optimizer
        params = [p for g in part.optimizer.param_groups for p in g["params"]]
        with torch.no_grad():
            for param, value in zip(params, saved["main"], strict=True):
                param.copy_(value)


def save(ctx: TrainerParts, version: int) -> dict[str, float]:
    """Write this rank's training state for `version` (weights published as `version`); row metrics."""
    if ctx.durable is None:
        return {}
    t = time.perf_counter()
    critic = None
    if ctx.critic is not None:
        critic = {"params": {n: p.detach() for n, p in ctx.critic.named_parameters()},
                  "optimizer": optimizer_state(ctx.critic)}
    adapters = getattr(ctx.engine, "adapter_state", None)  # LoRA: the adapters, whose base the version merged
    payload = {"version": version, "layout": layout_of(ctx), "optimizer": optimizer_state(ctx.engine),
               "critic": critic, "adapters": adapters() if adapters is not None else None}
    path = ctx.durable.write_train_file(version, file_name(_rank()), lambda tmp: torch.save(payload, tmp))
    return {"train_state_s": time.perf_counter() - t, "train_state_bytes": float(path.stat().st_size)}


def _read(ctx: TrainerParts, version: int) -> tuple[dict[str, Any] | None, str]:
    """This rank's state for `version` if it can be used, else (None, why not)."""
    if ctx.durable is None:
        return None, "checkpointEngine.persist is not set"
    path = ctx.durable.train_dir(version) / file_name(_rank())
    if not path.exists():
        return None, f"{path} does not exist"
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - a damaged file means fresh state, not a dead job
        return None, f"{path} is unreadable: {e}"
    if not isinstance(payload, dict) or payload.get("version") != version:
        return None, f"{path} does not hold version {version}'s training state"
    if payload.get("layout") != layout_of(ctx):
        return None, f"{path} was written with layout {payload.get('layout')}, this run has {layout_of(ctx)}"
    return payload, ""


def _owned(value: Any) -> Any:
    """`value` with every tensor copied into storage of its own.

    `torch.load` hands out tensors whose storages belong to the file reader and cannot be resized;
    the optimizer keeps them as its state, and the offloader releases its storages by resizing them
    to zero between phases (`offload.HostOffloader`)."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, dict):
        return {k: _owned(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_owned(v) for v in value)
    return value


def _everyone(ok: bool) -> bool:
    """True only if `ok` on every rank (collective)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return ok
    flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=common.device())
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def restore(ctx: TrainerParts, version: int) -> bool:
    """Restore every rank's state for `version`, or none (collective); call after loading its weights."""
    payload, why = _read(ctx, version)
    if not _everyone(payload is not None):
        log.warning("training state of version %d not restored, optimizer starts afresh: %s", version,
                    why or "another rank has none")
        for engine in (ctx.engine, ctx.critic):
            reload = getattr(_optimizer(engine), "reload_model_params", None) if engine is not None else None
            if reload is not None:  # Megatron in bf16: its fp32 master weights must follow the loaded weights
                reload()
        return False
    assert payload is not None
    payload = _owned(payload)
    if payload.get("adapters") is not None:  # the loaded version merged them into the base: unmerge exactly
        ctx.engine.restore_adapters(payload["adapters"])  # type: ignore[attr-defined]
    load_optimizer_state(ctx.engine, payload["optimizer"])
    if ctx.critic is not None:
        params = dict(ctx.critic.named_parameters())
        with torch.no_grad():
            for name, value in payload["critic"]["params"].items():
                params[name].copy_(value)
        load_optimizer_state(ctx.critic, payload["critic"]["optimizer"])
    where = Path(ctx.durable.train_dir(version)) if ctx.durable is not None else None
    log.info("restored training state of version %d (optimizer%s) from %s", version,
             " and critic" if ctx.critic is not None else "", where)
    return True
