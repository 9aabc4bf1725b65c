"""The RL loop of a job: one screen, top to bottom. Trainer rank 0 drives; every rank trains.

Rollout (trainer offloaded; from the job's `RolloutSource`: synchronous, partial or asynchronous;
for kto the labelled rows of the iteration and their KL probes, `LabelledSource`, nothing generated)
→ Onload → Inference (reference log-probs overlapped with rewards)
→ Train → Publish (HF layout in shared memory, registered in etcd) → [Persist, Export] → Offload →
Sync (every rollout loads the new version) → [Eval on the live rollouts: at the start, every
`eval.every` iterations and at the end]. Phase, iteration and metrics go to etcd (`Progress`) and, when
TANDEM_OUTPUT_DIR is set, to metrics.jsonl. Each phase's work lives in its own module under `phases/` (`generate`,
`switch`, `inference`, `train`, `mismatch_guard`, `publish`, `evaluate`, `report`); `context.TrainerContext` holds
what they share.
Caller: `tandem.sidecars.trainer.rank.run_rank`.
"""

from __future__ import annotations

from contextlib import nullcontext
from functools import partial
from typing import Any

from tandem.sidecars.startup import freeze_start_up
from tandem.sidecars.trainer.loop.phases import mismatch_guard
from tandem.sidecars.trainer.loop.phases.evaluate import evaluate
from tandem.sidecars.trainer.loop.phases.generate import labelled, rollout, start_source
from tandem.sidecars.trainer.loop.phases.inference import inference, summarize
from tandem.sidecars.trainer.loop.phases.publish import export, persist, publish, sync
from tandem.sidecars.trainer.loop.phases.report import record, report
from tandem.sidecars.trainer.loop.phases.switch import offload, onload, release_rollouts
from tandem.sidecars.trainer.loop.phases.train import train
from tandem.sidecars.trainer.loop.recovery import inflight
from tandem.sidecars.trainer.loop.rollout.sources import LabelledSource, RolloutSource
from tandem.sidecars.trainer.loop.start import create, start_version
from tandem.sidecars.trainer.observe import memory
from tandem.sidecars.trainer.observe.timing import PhaseTimer
from tandem.spec.models import RLHFJob
from tandem.spec.podenv import PodEnv


def run(env: PodEnv, job: RLHFJob) -> None:
    ctx = create(env, job)
    iterations = job.spec.algorithm.iterations
    version, it, failed = -1, ctx.first_iteration, True
    source: RolloutSource | None = None
    kto = job.spec.algorithm.name == "kto"  # trains on labelled rows: the rollouts only evaluate and probe
    guarding = job.spec.algorithm.mismatch_guard  # judged after each train phase, before the update is published
    guard = mismatch_guard.Guard(guarding) if guarding is not None else None
    try:
        version = start_version(ctx)  # publish the initial weights, or resume the latest version
        source = start_source(ctx, version) if ctx.is_driver and not kto else None
        rows = LabelledSource(ctx.dataset, job.spec.rollout.prompts_per_iteration) if ctx.is_driver and kto else None
        with source.exclusive(version) if source is not None else nullcontext():
            evaluate(ctx, ctx.first_iteration, version)  # the starting weights, before any training
        freeze_start_up()  # start-up's objects live for the run: later collections skip them
        for it in range(ctx.first_iteration, iterations):
            # seconds and memory per phase; freed memory handed back after the phases that free some
            timer = PhaseTimer(memory.PhaseMemory(releasing=memory.FREEING))
            info: dict[str, Any] = {}
            report(ctx, "rollout", it, version)
            with timer("rollout"):
                samples, inputs, scored = (rollout(ctx, source, it, info) if source is not None else
                                           labelled(ctx, rows, it, info) if rows is not None else ([], [], None))
            with timer("release"):
                release_rollouts(ctx)
            samples = ctx.broadcast(samples)
            with timer("onload"):
                onload(ctx)
            report(ctx, "inference", it, version)
            with timer("inference"):
                info |= inference(ctx, samples, inputs, scored)
            info |= summarize(samples)
            report(ctx, "train", it, version, reward=info["reward_mean"])
            with timer("train"):
                info |= train(ctx, samples)
            if guarding is not None:  # warn goes on; pause waits here; fail raises (its line: the job's failure)
                mismatch_guard.enforce(ctx, guard, it, version, info, report=partial(report, ctx),
                                       record=partial(record, ctx, it, version, info, timer))
            report(ctx, "publish", it, version, reward=info["reward_mean"])
            with timer("publish"):
                version = publish(ctx, version + 1)
            info["version_bytes"] = ctx.last_publish_bytes  # what each rollout pod receives (adapters: a few MB)
            if source is not None and ctx.registry is not None:  # a restart re-generates what is in flight
                source.published(version)
                inflight.save(ctx.registry, source.record(version))
            if ctx.durable is not None:  # checkpointEngine.persist: training state now, weights in the background
                with timer("persist"):
                    info |= persist(ctx, it, version)
            if job.spec.export is not None and ctx.is_driver:
                with timer("export"):
                    info |= export(ctx, it, version)
            with timer("offload"):
                offload(ctx)
            report(ctx, "sync", it, version, reward=info["reward_mean"])
            with timer("sync"):  # shared rollouts: the producer loads the version before its next batch
                info["sync_seconds"] = sync(ctx, version, load=source is None or not source.shared)
            with timer("eval"), source.exclusive(version) if source is not None else nullcontext():
                result = evaluate(ctx, it + 1, version)
            if result is not None:
                info["eval"] = result.row()
            record(ctx, it, version, info, timer)
            report(ctx, "rollout", it + 1, version, reward=info["reward_mean"])
        report(ctx, "done", iterations, version)
        failed = False
    except Exception as e:
        report(ctx, "failed", it, version, message=f"pod {ctx.env.pod}, trainer (driver): {type(e).__name__}: {e}")
        raise
    finally:
        if source is not None:
            source.close()
        ctx.close(failed=failed)
