"""The Train phase: `algorithm.epochs` passes over the iteration's samples, `trainer.globalBatchSize`
samples per optimizer step, on every rank (and the critic's value loss on the same rows, PPO with a critic).

Role: the algorithm packs the samples into rows (`Algorithm.prepare`); each optimizer step trains on its
share of them with the algorithm's micro-batch loss (`loss`); the metrics are the steps' mean, each step's own
are in `steps` (metrics.jsonl), and the rollout/trainer mismatch is the first step's (measured before any
update). Every step's ratio is taken against the policy that sampled: the Inference phase fills the old
log-probs whenever there is more than one (`optimizer_steps`). Callers: `driver.run`, `inference`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from tandem.sidecars.algorithms.algorithm_interface import Sample
from tandem.sidecars.algorithms.packing import PackedBatch
from tandem.sidecars.algorithms.rollout_correction import summarize as summarize_correction
from tandem.sidecars.trainer.engines.heads import shift_to_labels

if TYPE_CHECKING:
    from tandem.sidecars.trainer.loop.context import TrainerContext
    from tandem.spec.models import JobSpec

# what each optimizer step reports in the iteration's `steps` list (metrics.jsonl)
STEP_KEYS = ("loss", "pg_loss", "ratio_mean", "ratio_std", "clip_frac", "clip_frac_low", "clip_frac_high", "kl",
             "grad_norm", "value_loss", "value_clip_frac", "tokens")


def optimizer_steps(spec: JobSpec, samples: list[Sample]) -> int:
    """Optimizer steps per epoch: one per `trainer.globalBatchSize` samples trained on (KTO's KL probes only
    set its reference point). The Inference phase reads it too: more than one update in an iteration needs the
    old policy's log-probs (`inference.needs_old_logprobs`)."""
    trained = sum(not s.kl_probe for s in samples)
    return max(1, math.ceil(trained / spec.trainer.global_batch_size))


def train(ctx: TrainerContext, samples: list[Sample]) -> dict[str, Any]:
    """`epochs` passes over the iteration's samples, `globalBatchSize` samples per optimizer step."""
    spec = ctx.job.spec
    batch = ctx.algorithm.prepare(samples, ctx.token_budget(samples))
    if batch.num_rows == 0:  # e.g. DPO when every group's rewards tie: nothing to learn from
        return {"skipped_train": 1.0}
    steps = optimizer_steps(spec, samples)
    sums: dict[str, float] = {}
    first: dict[str, float] = {}
    per_step: list[dict[str, float]] = []
    parts = batch.split(steps)  # fewer than `steps` when the batch packs into fewer rows
    for epoch in range(spec.algorithm.epochs):
        for part in parts:
            m = ctx.engine.train_step(part, loss(ctx, len(parts)), reduction="sum")
            if ctx.critic is not None:  # the value loss on the same rows, returns from this batch
                c = ctx.critic.train_step(part, loss(ctx, len(parts), critic=True), reduction="sum")
                m |= {"value_loss": c["value_loss"], "value_clip_frac": c["value_clip_frac"],
                      "critic_grad_norm": c["grad_norm"]}
            for k, v in m.items():
                sums[k] = sums.get(k, 0.0) + v
            first = first or dict(m)
            per_step.append({"epoch": float(epoch), **{k: m[k] for k in STEP_KEYS if k in m}})
    n = len(per_step)
    out: dict[str, Any] = {k: v / n for k, v in sums.items() if not k.startswith("rc_")}
    out |= {f"prepare_{k}": v for k, v in batch.stats.items()}
    # each update's own figures: its ratio leaves 1 and its clip bites from the second step on
    out |= {"optimizer_steps": float(n), "steps": per_step}
    out |= {f"last_step_{k}": per_step[-1][k] for k in ("ratio_mean", "clip_frac") if k in per_step[-1]}
    # the rollout/trainer mismatch is measured before any update: the first step's weights (its rc_ sums
    # become the batch's mismatch_kl, ESS and clipped/masked shares)
    out |= summarize_correction({k: v for k, v in first.items() if k.startswith(("mismatch_", "tis_", "rc_"))})
    ctx.last_kl = out.get("kl")
    return out


def loss(ctx: TrainerContext, steps: int, critic: bool = False) -> Any:
    """Per-micro-batch loss: the algorithm's (or its critic loss, on values), on outputs shifted to
    its next-token layout.

    The algorithm's micro-batch losses add up to the loss of the packed batch (weights are
    global), hence reduction="sum"; each of the `steps` optimizer steps sees 1/steps of them.
    """
    loss_of: Callable[[torch.Tensor, PackedBatch], tuple[torch.Tensor, dict[str, float]]] = ctx.algorithm.loss
    if critic:  # the capability that comes with needs_values (PPO with a learned critic)
        critic_loss = getattr(ctx.algorithm, "critic_loss", None)
        if not ctx.algorithm.needs_values or critic_loss is None:
            raise TypeError(f"{ctx.algorithm.name} has no critic loss")
        loss_of = critic_loss

    def loss_fn(out: torch.Tensor, mb: PackedBatch) -> tuple[torch.Tensor, dict[str, float]]:
        value, metrics = loss_of(shift_to_labels(out), mb)
        return value * steps, metrics

    return loss_fn
