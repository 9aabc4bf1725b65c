"""The Rollout phase on the driver rank: the iteration's samples from the job's rollout source.

Role: `start_source` opens the job's rollout mode (`sources.make_source`: synchronous, partial or
asynchronous), with what a resumed run re-generates (`inflight`); `rollout` asks it for groupSize completions
per prompt (rollout pods registered since join first), with algorithm.dynamicSampling only the groups whose
rewards differ, and turns them into the algorithm's samples and the rewards' inputs, with the phase's
figures; `labelled` is KTO's: the labelled rows of the iteration and their KL probes, nothing generated;
`greedy_probe` tracks the weights the rollouts hold. Caller: `driver.run`.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from tandem.sidecars.algorithms.algorithm_interface import Sample
from tandem.sidecars.rewards.combine import RewardInput
from tandem.sidecars.rollout_engine.sampling import SamplingOptions
from tandem.sidecars.trainer.loop.data.dataset import pictures_of
from tandem.sidecars.trainer.loop.recovery import inflight, resume
from tandem.sidecars.trainer.loop.rollout import dynamic_sampling
from tandem.sidecars.trainer.loop.rollout.dynamic_sampling import Scores
from tandem.sidecars.trainer.loop.rollout.partial import Group, staleness_stats
from tandem.sidecars.trainer.loop.rollout.sources import (
    LabelledSource,
    RolloutSource,
    SyncSource,
    make_source,
    to_samples,
    turn_stats,
)
from tandem.spec import seeds

if TYPE_CHECKING:
    from tandem.sidecars.trainer.loop.context import TrainerContext


def start_source(ctx: TrainerContext, version: int) -> RolloutSource:
    """The job's rollout mode (synchronous, partial, asynchronous), with what a resumed run re-generates."""
    if ctx.rollouts is None:
        raise RuntimeError("only the driver rank talks to rollouts")
    record = None
    if ctx.resumed is not None and ctx.registry is not None:
        record = inflight.load(ctx.registry, ctx.resumed[0])
    source, ctx.rollouts = make_source(ctx.job.spec, ctx.dataset, ctx.rollouts, registry=ctx.registry,
                                       token=ctx.env.token, generation=ctx.env.restart_generation,
                                       version=version, first_iteration=ctx.first_iteration, resumed=record)
    return source


def rollout(ctx: TrainerContext, source: RolloutSource, iteration: int,
            info: dict[str, Any]) -> tuple[list[Sample], list[RewardInput], Scores | None]:
    """groupSize completions per prompt from the rollout source: the algorithm's samples and what
    the rewards judge (the user's question, the completion's text, the reference answer); with
    algorithm.dynamicSampling, only groups whose rewards differ, and their rewards."""
    spec = ctx.job.spec
    if ctx.rollouts is None:
        raise RuntimeError("only the driver rank talks to rollouts")
    opts = SamplingOptions(temperature=spec.rollout.temperature, top_p=spec.rollout.top_p,
                           max_tokens=spec.rollout.max_tokens, seed=seeds.request_seed(spec.seed, iteration))
    joined = []
    if ctx.registry is not None:  # rollout pods that registered since (scaled up)
        found = resume.rollout_pods(ctx.registry, ctx.env.restart_generation,
                                    rollout_only=False if source.hybrid_only else None)
        joined = ctx.rollouts.join(found, ctx.version)  # a rollout back from a failure: at this version
    t = time.perf_counter()
    groups, stats = source.next(iteration, ctx.version, opts)
    seconds = time.perf_counter() - t
    if not source.shared:  # (on shared rollouts it would wait for the producer's next batch)
        info["probe"] = greedy_probe(ctx, opts)
    def samples_of(gs: list[Group]) -> tuple[list[Sample], list[RewardInput]]:
        return to_samples(gs, ctx.eos_id, lambda ids: str(ctx.tokenizer.decode(ids, skip_special_tokens=True)),
                          ctx.pixels if ctx.image_processor is not None else None)

    scored: Scores | None = None
    dynamic = spec.algorithm.dynamic_sampling
    if dynamic is not None and isinstance(source, SyncSource):
        filled = dynamic_sampling.fill(groups, lambda r: source.more(iteration, r, ctx.version, opts), samples_of,
                                       ctx.rewards.score, spec.rollout.prompts_per_iteration, dynamic.max_rounds)
        groups, samples, inputs, scored = filled.groups, filled.samples, filled.inputs, (filled.rewards,
                                                                                        filled.components)
        stats = {**stats, **filled.stats}
        seconds = time.perf_counter() - t
    else:
        samples, inputs = samples_of(groups)
    info.update(stats)
    info.update(turn_stats(groups))  # multi-turn: turns, tool calls and errors, tool seconds
    if "tool_seconds" in info:  # tool time per second of generation: its share when calls do not overlap
        info["tool_share"] = info["tool_seconds"] / max(seconds, 1e-9)
    info.update(staleness_stats(groups, ctx.version))
    oldest = min((seg.version for g in groups for m in g.members for seg in m.segments), default=ctx.version)
    info.update(completions=len(samples), generate_seconds=seconds, rollout_version=oldest,
                rollouts=len(ctx.rollouts.addresses), rollouts_joined=len(joined), **ctx.rollouts.faults.take(),
                completions_per_s=len(samples) / max(seconds, 1e-9),
                completion_tokens=sum(len(s.completion_ids) for s in samples))
    if any(s.routed_experts is not None for s in samples):  # routing replay: the share the trainer replays
        info["routed_frac"] = sum(s.routed_experts is not None for s in samples) / len(samples)
    return samples, inputs, scored


def labelled(ctx: TrainerContext, rows: LabelledSource, iteration: int,
             info: dict[str, Any]) -> tuple[list[Sample], list[RewardInput], Scores]:
    """KTO: the iteration's labelled rows and their KL probes, nothing generated; the labels are the
    rewards (1 desirable, 0 undesirable: given as scored, so no reward runs). The greedy probe tracks
    the weights the rollouts hold, as in `rollout`."""
    if ctx.rollouts is None:
        raise RuntimeError("only the driver rank talks to rollouts")
    spec = ctx.job.spec.rollout
    samples, stats = rows.next(iteration)
    examples = [s for s in samples if not s.kl_probe]
    opts = SamplingOptions(temperature=spec.temperature, top_p=spec.top_p, max_tokens=spec.max_tokens)
    info.update(stats, probe=greedy_probe(ctx, opts), completions=len(examples), kl_probes=len(samples) - len(examples),
                completion_tokens=sum(len(s.completion_ids) for s in examples), rollout_version=ctx.version,
                rollouts=len(ctx.rollouts.addresses))
    return samples, [], ([s.reward for s in samples], {})


def greedy_probe(ctx: TrainerContext, opts: SamplingOptions) -> dict[str, str]:
    """The greedy completion of the dataset's first prompt, every iteration: it tracks the weights."""
    if ctx.rollouts is None:
        raise RuntimeError("only the driver rank talks to rollouts")
    probe = ctx.dataset.prompts[0]
    greedy, _ = ctx.rollouts.generate([probe.model_input], opts.model_copy(update={"temperature": 0.0, "seed": 0}),
                                      n=1, **pictures_of([probe]))
    return {"prompt": probe.question, "greedy": greedy[0][0].text}
