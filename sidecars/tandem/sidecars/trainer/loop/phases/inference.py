"""The Inference phase: reference, old-policy (`needs_old_logprobs`) and teacher log-probs and critic values
(collective forwards on every rank) overlapped with the rewards (driver rank), filled into the samples; and what
they sum to.

Role: with data parallelism each dp rank runs the forwards on its share of the packed rows and the per-sample
results are gathered over the dp group (`sharded`), so every rank ends with all of them; the rewards reach the
other ranks by a host broadcast. `summarize` gives the rewards and lengths of the samples trained on.
Caller: `driver.run`.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

from tandem.sidecars.algorithms.algorithm_interface import AlgorithmError, Sample, pack_samples
from tandem.sidecars.rewards.combine import RewardInput, overlapped
from tandem.sidecars.trainer.loop.forwards import sharded
from tandem.sidecars.trainer.loop.phases.train import optimizer_steps

if TYPE_CHECKING:
    from tandem.sidecars.trainer.loop.context import TrainerContext


def inference(ctx: TrainerContext, samples: list[Sample], inputs: list[RewardInput],
              scored: tuple[list[float], dict[str, list[float]]] | None = None) -> dict[str, Any]:
    """Reference log-probs (collective) overlapped with rewards (driver); fills the samples. Rewards
    already computed (`scored`: dynamic sampling's) are used as they are.

    With data parallelism each dp rank runs the forwards on its share of the packed rows and
    the per-sample results are gathered over the dp group, so every rank ends with all of them.
    """
    packed = pack_samples(samples, ctx.token_budget(samples), pad_id=ctx.pad_id,
                          share_prompts=ctx.job.spec.trainer.share_prompts)
    need_old = needs_old_logprobs(ctx, samples)
    forwards = [ctx.reference, ctx.engine if need_old else None, ctx.critic, ctx.teacher]

    def model_work() -> list[dict[int, list[float]]]:
        """Reference, old-policy and teacher log-probs, critic values: per sample, collective forwards."""
        return sharded.per_sample_outputs(
            [None if e is None else partial(e.token_logprobs, scored_only=True) for e in forwards],
            packed, ctx.engine.par)

    info: dict[str, Any] = {}
    if ctx.is_driver and scored is not None:
        (ref, old, values, teacher), rewards = model_work(), scored[0]
        info["reward_components"] = {k: sum(v) / len(v) for k, v in scored[1].items() if v}
    elif ctx.is_driver:
        result = overlapped(ctx.rewards, inputs, model_work)
        (ref, old, values, teacher), rewards = result.model_result, result.rewards
        info["overlap_fraction"] = result.timings.overlap_fraction
        info["reward_components"] = {k: sum(v) / len(v) for k, v in result.components.items()}
    else:
        (ref, old, values, teacher), rewards = model_work(), []
    rewards = ctx.broadcast(rewards)
    if ctx.job.spec.algorithm.old_logprobs == "rollout":
        old = rollout_as_old(samples)
    for i, s in enumerate(samples):
        s.reward = float(rewards[i])
        if i in ref:
            s.ref_logprobs = ref[i]
        if i in old:
            s.old_logprobs = old[i]
        if i in values:
            s.values = values[i]
        if i in teacher:
            s.teacher_logprobs = teacher[i]
    return info


def needs_old_logprobs(ctx: TrainerContext, samples: list[Sample]) -> bool:
    """Whether the Inference phase runs the trainer's forward for the old policy's log-probs: the algorithm
    needs them, or (algorithm.oldLogprobs auto) the iteration takes more than one optimizer step, whose later
    steps would otherwise take their ratio against weights already updated (ratio 1, no trust region), or
    (trainer) always; never with oldLogprobs rollout, whose old policy is the rollout's own log-probs."""
    mode = ctx.job.spec.algorithm.old_logprobs
    if mode == "rollout":
        return False
    return (mode == "trainer" or ctx.algorithm.needs_old_logprobs
            or optimizer_steps(ctx.job.spec, samples) * ctx.job.spec.algorithm.epochs > 1)


def rollout_as_old(samples: list[Sample]) -> dict[int, list[float]]:
    """algorithm.oldLogprobs rollout: each sample's rollout log-probs as its old ones, which then carry no
    rollout log-probs of their own (a correction against themselves would measure nothing)."""
    old: dict[int, list[float]] = {}
    for i, s in enumerate(samples):
        if s.rollout_logprobs is None:
            raise AlgorithmError(f"algorithm.oldLogprobs rollout: sample {i} came back without the rollout's "
                                 "log-probs (use oldLogprobs auto)")
        old[i], s.rollout_logprobs = s.rollout_logprobs, None
    return old


def summarize(samples: list[Sample]) -> dict[str, float]:
    """Rewards and lengths of the samples trained on (not KTO's KL probes)."""
    samples = [s for s in samples if not s.kl_probe]
    rewards = [s.reward for s in samples]
    mean = sum(rewards) / max(len(rewards), 1)
    std = (sum((r - mean) ** 2 for r in rewards) / max(len(rewards), 1)) ** 0.5
    return {"reward_mean": mean, "reward_std": std,
            "completion_len": sum(len(s.completion_ids) for s in samples) / max(len(samples), 1)}
