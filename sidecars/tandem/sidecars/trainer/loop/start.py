"""Start of a trainer process: the context built once (`create`), the starting weights published (`start_version`).

Role: `create` builds the trainer engine (Megatron or transformers + FSDP2, as trainer.engine says; for PPO with
`critic: true`, a value-head critic engine), reference and teacher weights, algorithm, rewards and dataset on
every rank, and on the driver rank the evaluator, the tracker, the etcd registry, the shared-memory publisher,
the checkpoint-engine API and the rollout client (after waiting for the rollouts of this gang generation);
with checkpointEngine.persist, the durable store (and on resume the version to start from, `resume`).
`start_version` publishes the starting weights (initial, or resumed) as a fresh version and syncs the
rollouts to it. Caller: `driver.run`.
"""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path

from tandem.checkpoint_engine.etcd import keys
from tandem.checkpoint_engine.etcd.endpoints import split_endpoints
from tandem.checkpoint_engine.etcd.sync_registry import SyncRegistry
from tandem.checkpoint_engine.service.publisher import Publisher
from tandem.checkpoint_engine.versions.durable import DurableStore
from tandem.sidecars.algorithms.algorithm_choice import make_algorithm
from tandem.sidecars.rewards.combine import RewardSet
from tandem.sidecars.startup import etcd_security
from tandem.sidecars.trainer.engines.engine_choice import build_engine
from tandem.sidecars.trainer.loop.context import TrainerContext
from tandem.sidecars.trainer.loop.data.dataset import PromptDataset
from tandem.sidecars.trainer.loop.forwards.reference import ReferenceWeights
from tandem.sidecars.trainer.loop.held_out import Evaluator
from tandem.sidecars.trainer.loop.phases.publish import publish, sync
from tandem.sidecars.trainer.loop.phases.report import report, waiting
from tandem.sidecars.trainer.loop.phases.switch import offload
from tandem.sidecars.trainer.loop.recovery import resume
from tandem.sidecars.trainer.loop.recovery.persist import Persister
from tandem.sidecars.trainer.loop.rollout.rollout_client import RolloutClient
from tandem.sidecars.trainer.observe.prom import LoopMetrics
from tandem.sidecars.trainer.observe.tracking import Tracker
from tandem.spec.models import RLHFJob
from tandem.spec.podenv import PodEnv
from tandem.spec.trainer import vision_language

log = logging.getLogger(__name__)
SHOWN_REFUSALS = 20  # refused dataset rows named one by one in the log; the rest counted


def refusals(path: str, dataset: PromptDataset) -> None:
    """The dataset rows left out (a picture that cannot be used), named with their reasons in the log."""
    for n, why in dataset.refused[:SHOWN_REFUSALS]:
        log.warning("%s: row %d refused: %s", path, n, why)
    if len(dataset.refused) > SHOWN_REFUSALS:
        log.warning("%s: %d more rows refused", path, len(dataset.refused) - SHOWN_REFUSALS)
    if dataset.refused:
        log.warning("%s: %d of %d rows refused; the job goes on with the rest", path, len(dataset.refused),
                    len(dataset.refused) + len(dataset))


def create(env: PodEnv, job: RLHFJob) -> TrainerContext:
    from transformers import AutoTokenizer

    spec = job.spec
    engine = build_engine(spec, seed=spec.seed)
    # every log-prob of the policy (and of the reference and teacher scored in its place) is of the distribution
    # the rollouts sample from: the logits divided by the temperature, as vLLM's processed log-probs are
    engine.temperature = spec.rollout.temperature
    tok = AutoTokenizer.from_pretrained(spec.model.path)
    eos = int(tok.eos_token_id if tok.eos_token_id is not None else 0)
    pad = int(tok.pad_token_id if tok.pad_token_id is not None else eos)
    algorithm = make_algorithm(spec.algorithm, pad_id=pad, share_prompts=spec.trainer.share_prompts,
                               max_tokens=spec.rollout.max_tokens)
    critic = None
    if algorithm.needs_values:  # PPO's learned critic: the policy's transformer with a zeroed value head
        critic = build_engine(spec, seed=spec.seed + 1, value_head=True)
    needs_ref = algorithm.needs_reference or spec.algorithm.kl_coef > 0
    reference = ReferenceWeights.capture(engine, spec.reference.path) if needs_ref else None
    distill = spec.algorithm.distillation
    teacher = ReferenceWeights.capture(engine, distill.teacher) if distill is not None else None
    ctx = TrainerContext(env, job, engine, reference, algorithm, RewardSet(spec.rewards),
                         PromptDataset.load(spec.dataset, tok, seed=spec.seed), eos, pad, seed=spec.seed,
                         critic=critic, tokenizer=tok, teacher=teacher)
    if vision_language(spec.model.path):  # pictures become pixel values as the rollout's processor makes them
        from transformers import AutoProcessor

        ctx.image_processor = AutoProcessor.from_pretrained(spec.model.path).image_processor
    if ctx.is_driver:
        refusals(spec.dataset.path, ctx.dataset)
        if spec.eval is not None:
            held_out = PromptDataset.load(spec.eval.dataset, tok)
            refusals(spec.eval.dataset.path, held_out)
            ctx.evaluator = Evaluator(spec.eval, held_out.prompts, spec.rewards,
                                      max_tokens=spec.rollout.max_tokens, iterations=spec.algorithm.iterations,
                                      multi_turn=spec.rollout.environment is not None
                                      and spec.rollout.environment.type != "single")
        ctx.tracker = Tracker.create(spec.tracking, env.output_dir, env.job,
                                     job.spec.model_dump(mode="json", by_alias=True, exclude_none=True),
                                     namespace=env.namespace, uid=env.job_uid)  # W&B: project, run id
        etcd = split_endpoints(env.etcd_endpoints)  # every member: the registry fails over among them
        ctx.registry = SyncRegistry(etcd, env.namespace, env.job, env.pod, "trainer", uid=env.job_uid,
                                    security=etcd_security(env)).connect()
        ctx.publisher = Publisher(env.shm_dir, env.job, ctx.registry, keep=2,
                                  shard_bytes=spec.checkpoint_engine.shard_size_mi_b << 20)
    saving = spec.checkpoint_engine.persist
    if saving is not None:  # every rank writes its training state there; the driver copies weights
        ctx.durable = DurableStore(Path(saving.path), env.namespace, env.job, env.job_uid, keep=saving.keep)
        if ctx.registry is not None:
            ctx.persister = Persister(ctx.durable, ctx.registry, env.shm_dir, env.job, every=saving.every,
                                      iterations=spec.algorithm.iterations)
    ctx.resumed = resume.resume_point(ctx) if env.resume else None  # before the publisher's cleanup
    if ctx.publisher is not None and ctx.registry is not None:
        ctx.publisher.recover()
        ctx.prom = LoopMetrics()
        serve_control_api(ctx.publisher, env, ctx.prom)
        expected = spec.replicas + spec.rollout_only_replicas  # more may join later (scaled up)
        # rollout-only pods kept through a gang restart advertise under this generation once they read it
        ctx.registry.put_json(keys.gang(ctx.registry.namespace, ctx.registry.scope),
                              {"generation": env.restart_generation})
        addresses = resume.wait_for_rollouts(ctx.registry, expected, env.restart_generation)
        registry, generation, policy = ctx.registry, env.restart_generation, spec.failure_policy
        ctx.rollouts = RolloutClient(addresses, env.token, stall_s=float(policy.rollout_stall_seconds),
                                     unavailable_s=float(policy.rollout_unavailable_seconds),
                                     discover=lambda: resume.rollout_pods(registry, generation),
                                     on_wait=partial(waiting, ctx))
        ctx.rollouts.names.update(resume.rollout_pods(registry, generation))
    return ctx


def serve_control_api(publisher: Publisher, env: PodEnv, prom: LoopMetrics) -> None:
    """The trainer's checkpoint-engine API (status, gc, /metrics) on TANDEM_CE_PORT, in a daemon thread."""
    from tandem.checkpoint_engine.service.api import create_app
    from tandem.sidecars.serve import start_server

    start_server(create_app(publisher, env.token, prom.registry), env.port, "trainer-api")


def start_version(ctx: TrainerContext) -> int:
    """Publish the starting weights (initial, or resumed from shm) as a fresh version; sync rollouts."""
    previous = None
    if ctx.resumed is not None:
        previous, ctx.first_iteration = ctx.resumed
    wanted = None if previous is None else previous + 1
    if wanted is not None and ctx.publisher is not None:  # the old lease may still hold newer records
        wanted = max(wanted, ctx.publisher.next_version())
    version = publish(ctx, wanted)
    offload(ctx)  # the loop onloads before each train phase
    if ctx.is_driver:
        report(ctx, "sync", ctx.first_iteration, version)
        ctx.last_sync = sync(ctx, version, initial=True)
    return version
