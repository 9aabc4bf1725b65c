"""What the loop reports: the phase in etcd, and each iteration's metrics row.

Role: `report` writes the job's progress record (`Progress`: phase, iteration, version, the latest reward,
KL, sync time, eval, turns, agreement and guard figures, the rollouts' engine restarts, rejoins and latest
recovery), which the operator shows in the job's status and
`tandem run` in its table; `waiting` puts the reason the rollout client waits for a healthy rollout in it,
keeping the phase and figures; `record` writes the iteration's metrics row to Prometheus, the tracker
(TensorBoard / MLflow) and, when TANDEM_OUTPUT_DIR is set, metrics.jsonl, and keeps the figures the next
reports carry (`engines_after`: the iteration's fault counts, its own and its asynchronous producer's, folded
into the counts since the driver started). Driver rank only (the others return at once).
Callers: `driver.run`, the phase modules, `start.create` (`waiting`, the rollout client's callback).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tandem.checkpoint_engine.etcd import keys
from tandem.spec import devices
from tandem.spec.progress import EvalSummary, Phase, Progress, RolloutEngines

if TYPE_CHECKING:
    from tandem.sidecars.trainer.loop.context import TrainerContext
    from tandem.sidecars.trainer.observe.timing import PhaseTimer

log = logging.getLogger(__name__)


def report(ctx: TrainerContext, phase: Phase, iteration: int, version: int, *, reward: float | None = None,
           message: str = "") -> None:
    if not ctx.is_driver or ctx.registry is None:
        return
    p = Progress(phase=phase, iteration=iteration, iterations=ctx.job.spec.algorithm.iterations,
                 weight_version=version, last_sync_seconds=ctx.last_sync, reward_mean=reward,
                 kl=ctx.last_kl, message=message, updated_at=time.time(), eval=eval_summary(ctx),
                 turns_mean=ctx.last_turns.get("turns_mean"),
                 tool_calls_mean=ctx.last_turns.get("tool_calls_mean"),
                 mismatch_kl=ctx.last_agreement.get("mismatch_kl"), ess=ctx.last_agreement.get("mismatch_ess"),
                 staleness_mean=ctx.last_agreement.get("staleness_mean"), guard=ctx.last_guard,
                 rollout_engines=ctx.rollout_engines, rows_refused=len(ctx.dataset.refused))
    if reward is None:
        old = ctx.registry.get_json(keys.progress(ctx.registry.namespace, ctx.registry.scope))
        p.reward_mean = None if old is None else old.get("rewardMean")
    ctx.registry.put_json(keys.progress(ctx.registry.namespace, ctx.registry.scope), json.loads(p.to_json()))


def waiting(ctx: TrainerContext, reason: str) -> None:
    """No healthy rollout (the client waits for one): the reason in the job's progress record, which
    the operator shows in its status and `tandem run` in its table; the phase and figures stay."""
    if not ctx.is_driver or ctx.registry is None:
        return
    key = keys.progress(ctx.registry.namespace, ctx.registry.scope)
    try:
        old = ctx.registry.get_json(key) or {}
        ctx.registry.put_json(key, {**old, "message": reason, "updatedAt": time.time()})
    except Exception as e:  # noqa: BLE001 - etcd away too: the wait goes on, the log says why
        log.warning("could not record the wait in etcd: %s", e)
    log.warning("%s", reason)


def eval_summary(ctx: TrainerContext) -> EvalSummary | None:
    e = ctx.last_eval
    if e is None:
        return None
    return EvalSummary(iteration=e.iteration, weight_version=e.version, pass_at_1=e.pass_at_1,
                       pass_at_k=e.pass_at_k, k=e.samples, prompts=e.prompts)


def engines_after(before: RolloutEngines | None, info: Mapping[str, Any]) -> RolloutEngines | None:
    """The engine counts after an iteration whose metrics are `info`: restarts as the rollouts report them (a
    total; the larger of the driver's client and its asynchronous producer's, which may hear from the same
    rollouts), rejoins added up, the recovery of the iteration when one completed. None while no rollout has
    reported any (a rollout source without a pool: KTO's labelled rows)."""
    keys = ("rollout_restarts", "rollouts_rejoined", "rollout_recovery_s")
    seen = [p for p in ("", "producer_") if any(f"{p}{k}" in info for k in keys)]
    if not seen:
        return before
    out = before.model_copy() if before is not None else RolloutEngines()
    out.restarts = max([out.restarts] + [int(info.get(f"{p}rollout_restarts", 0)) for p in seen])
    out.rejoins += sum(int(info.get(f"{p}rollouts_rejoined", 0)) for p in seen)
    recovered = [float(info[f"{p}rollout_recovery_s"]) for p in seen if info.get(f"{p}rollout_recovery_s") is not None]
    if recovered:
        out.last_recovery_seconds = max(recovered)
    return out


def record(ctx: TrainerContext, iteration: int, version: int, info: dict[str, Any], timer: PhaseTimer) -> None:
    if not ctx.is_driver:
        return
    ctx.rollout_engines = engines_after(ctx.rollout_engines, info)
    ctx.last_turns = {k: info[k] for k in ("turns_mean", "tool_calls_mean") if k in info}
    ctx.last_agreement = {k: float(info[k]) for k in ("mismatch_kl", "mismatch_ess", "staleness_mean")
                          if info.get(k) is not None}
    guard = info.get("mismatch_guard", {})
    ctx.last_guard = guard.get("message", "") if guard.get("action") in ("warn", "pause") else ""
    row = {"iteration": iteration, "weight_version": version, **info, "rows_refused": len(ctx.dataset.refused),
           "seconds": timer.seconds, "total_seconds": timer.total,
           "switch_share": timer.share(("offload", "onload", "publish", "sync", "release")),
           "layout": {k: getattr(ctx.engine.par, k) for k in ("tp", "pp", "dp", "ep")},  # trainer ranks
           "engine": devices.trainer_engine(ctx.job.spec)}
    if timer.memory is not None:
        row["memory"] = timer.memory.summary()
    if ctx.prom is not None:
        ctx.prom.observe(row)
    if ctx.tracker is not None:
        ctx.tracker.log(iteration, row)
    if ctx.env.output_dir is not None:
        with open(ctx.env.output_dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
    log.info("iteration %d: reward %.3f kl %s sync %.2fs", iteration, info.get("reward_mean", 0.0),
             info.get("kl"), info.get("sync_seconds", 0.0))
