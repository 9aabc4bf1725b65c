"""The RL loop of a job: one screen, top to bottom. Trainer rank 0 drives; every rank trains.

Rollout (trainer offloaded; from the job's `RolloutSource`: synchronous, partial or asynchronous;
for kto the labelled rows of the iteration and their KL probes, `LabelledSource`, nothing generated)
→ Onload → Inference (reference log-probs overlapped with rewards)
→ Train → Publish (HF layout in shared memory, registered in etcd) → [Persist, Export] → Offload →
Sync (every rollout loads the new version) → [Eval on the live rollouts: at the start, every
`eval.every` iterations and at the end]. Phase, iteration and metrics go to etcd (`Progress`) and, when
TANDEM_OUTPUT_DIR is set, to metrics.jsonl. The phase work lives in `context.TrainerContext`.
Caller: `python -m tandem.sidecars.trainer`.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from datetime import timedelta
from functools import partial
from typing import Any

from tandem.sidecars.algorithms.base import Sample
from tandem.sidecars.rewards.combine import RewardInput
from tandem.sidecars.rollout_engine.sampling import SamplingOptions
from tandem.sidecars.trainer.loop import dynamic_sampling, host_wait, inflight, mismatch_guard, resume
from tandem.sidecars.trainer.loop.context import TrainerContext
from tandem.sidecars.trainer.loop.dynamic_sampling import Scores
from tandem.sidecars.trainer.loop.partial import Group, staleness_stats
from tandem.sidecars.trainer.loop.sources import (
    LabelledSource,
    RolloutSource,
    SyncSource,
    make_source,
    to_samples,
    turn_stats,
)
from tandem.sidecars.trainer.observe.memory import PhaseMemory
from tandem.sidecars.trainer.observe.timing import PhaseTimer
from tandem.spec import seeds
from tandem.spec.models import RLHFJob
from tandem.spec.podenv import PodEnv


def run_rank(local_rank: int, env: PodEnv, ranks_per_pod: int) -> None:
    """One trainer rank: device, CPU compatibility layer, global rank from the pod index, the loop."""
    import os

    import torch

    from tandem.sidecars import gpu
    from tandem.sidecars.trainer.engines import cpu_compat

    job = env.load_job()
    on_gpu = gpu.select(job.spec.gpus_per_pod, "trainer")  # NoUsableGpu rather than a quiet CPU run
    if on_gpu:
        torch.cuda.set_device(local_rank)
    os.environ.update(RANK=str(env.pod_index * ranks_per_pod + local_rank), LOCAL_RANK=str(local_rank),
                      WORLD_SIZE=str(env.replicas * ranks_per_pod), MASTER_ADDR=env.master_addr,
                      MASTER_PORT=str(env.master_port))
    if not on_gpu:
        cpu_compat.apply()
        torch.set_num_threads(cpu_threads(ranks_per_pod))
    timeout = timedelta(minutes=job.spec.trainer.process_group_timeout_minutes)
    host_wait.init(backend="nccl" if on_gpu else "gloo", rank=int(os.environ["RANK"]),
                   world_size=int(os.environ["WORLD_SIZE"]), timeout=timeout)
    host_wait.start(timeout)  # the other ranks wait out rollouts and evals here, not in NCCL
    run(env, job)


def cpu_threads(ranks_per_pod: int) -> int:
    """Threads of one CPU trainer rank: the pod's cores shared by its ranks. The hybrid deployment
    time-slices the pod, so while the trainer computes, the rollout (vLLM) sits idle and the
    active phase gets the machine (`tandem run` starts every sidecar with OMP_NUM_THREADS=1)."""
    import os

    return max(1, len(os.sched_getaffinity(0)) // max(1, ranks_per_pod))


def run(env: PodEnv, job: RLHFJob) -> None:
    ctx = TrainerContext.create(env, job)
    iterations = job.spec.algorithm.iterations
    version, it, failed = -1, ctx.first_iteration, True
    source: RolloutSource | None = None
    kto = job.spec.algorithm.name == "kto"  # trains on labelled rows: the rollouts only evaluate and probe
    guarding = job.spec.algorithm.mismatch_guard  # judged after each train phase, before the update is published
    guard = mismatch_guard.Guard(guarding) if guarding is not None else None
    try:
        version = ctx.start_version()  # publish the initial weights, or resume the latest version
        source = start_source(ctx, version) if ctx.is_driver and not kto else None
        rows = LabelledSource(ctx.dataset, job.spec.rollout.prompts_per_iteration) if ctx.is_driver and kto else None
        with source.exclusive(version) if source is not None else nullcontext():
            ctx.evaluate(ctx.first_iteration, version)  # the starting weights, before any training
        for it in range(ctx.first_iteration, iterations):
            timer = PhaseTimer(PhaseMemory())  # seconds and memory per phase; freed memory handed back
            info: dict[str, Any] = {}
            ctx.report("rollout", it, version)
            with timer("rollout"):
                samples, inputs, scored = (rollout(ctx, source, it, info) if source is not None else
                                           labelled(ctx, rows, it, info) if rows is not None else ([], [], None))
            with timer("release"):
                ctx.release_rollouts()
            samples = ctx.broadcast(samples)
            with timer("onload"):
                ctx.onload()
            ctx.report("inference", it, version)
            with timer("inference"):
                info |= ctx.inference(samples, inputs, scored)
            info |= summarize(samples)
            ctx.report("train", it, version, reward=info["reward_mean"])
            with timer("train"):
                info |= ctx.train(samples)
            if guarding is not None:  # warn goes on; pause waits here; fail raises (its line: the job's failure)
                mismatch_guard.enforce(ctx, guard, it, version, info,
                                       record=partial(ctx.record, it, version, info, timer))
            ctx.report("publish", it, version, reward=info["reward_mean"])
            with timer("publish"):
                version = ctx.publish(version + 1)
            info["version_bytes"] = ctx.last_publish_bytes  # what each rollout pod receives (adapters: a few MB)
            if source is not None and ctx.registry is not None:  # a restart re-generates what is in flight
                source.published(version)
                inflight.save(ctx.registry, source.record(version))
            if ctx.durable is not None:  # checkpointEngine.persist: training state now, weights in the background
                with timer("persist"):
                    info |= ctx.persist(it, version)
            if job.spec.export is not None and ctx.is_driver:
                with timer("export"):
                    info |= ctx.export(it, version)
            with timer("offload"):
                ctx.offload()
            ctx.report("sync", it, version, reward=info["reward_mean"])
            with timer("sync"):  # shared rollouts: the producer loads the version before its next batch
                info["sync_seconds"] = ctx.sync(version, load=source is None or not source.shared)
            with timer("eval"), source.exclusive(version) if source is not None else nullcontext():
                result = ctx.evaluate(it + 1, version)
            if result is not None:
                info["eval"] = result.row()
            ctx.record(it, version, info, timer)
            ctx.report("rollout", it + 1, version, reward=info["reward_mean"])
        ctx.report("done", iterations, version)
        failed = False
    except Exception as e:
        ctx.report("failed", it, version, message=f"pod {ctx.env.pod}, trainer (driver): {type(e).__name__}: {e}")
        raise
    finally:
        if source is not None:
            source.close()
        ctx.close(failed=failed)


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
        return to_samples(gs, ctx.eos_id, lambda ids: str(ctx.tokenizer.decode(ids, skip_special_tokens=True)))

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
                                      n=1)
    return {"prompt": probe.question, "greedy": greedy[0][0].text}


def summarize(samples: list[Sample]) -> dict[str, float]:
    """Rewards and lengths of the samples trained on (not KTO's KL probes)."""
    samples = [s for s in samples if not s.kl_probe]
    rewards = [s.reward for s in samples]
    mean = sum(rewards) / max(len(rewards), 1)
    std = (sum((r - mean) ** 2 for r in rewards) / max(len(rewards), 1)) ** 0.5
    return {"reward_mean": mean, "reward_std": std,
            "completion_len": sum(len(s.completion_ids) for s in samples) / max(len(samples), 1)}
