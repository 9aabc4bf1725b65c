"""Everything the driver loop needs, built once per trainer process, and each phase's work.

Role: keeps `driver.run` one screen long. `TrainerContext.create` builds the trainer engine (`engine`:
Megatron or transformers + FSDP2, as trainer.engine says; for PPO with `critic: true`, a value-head critic
engine trained on the returns after each policy step), reference weights, algorithm, rewards, dataset
and — on the driver rank — the etcd registry, the shared-memory publisher and the rollout client. Every
rank calls the collective methods (`inference`, `train`, `publish`) in the same order; the driver alone
talks to rollouts and etcd.
Caller: `tandem.sidecars.trainer.loop.driver`.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from tandem.checkpoint_engine import keys
from tandem.checkpoint_engine.durable import DurableStore
from tandem.checkpoint_engine.endpoints import split_endpoints
from tandem.checkpoint_engine.publisher import Publisher
from tandem.checkpoint_engine.sync_registry import SyncRegistry
from tandem.sidecars.algorithms.base import Algorithm, Sample, row_budget
from tandem.sidecars.algorithms.packing import PackedBatch
from tandem.sidecars.algorithms.registry import make_algorithm
from tandem.sidecars.algorithms.rollout_correction import summarize as summarize_correction
from tandem.sidecars.rewards.combine import RewardInput, RewardSet, overlapped
from tandem.sidecars.startup import etcd_security
from tandem.sidecars.trainer.engines import common
from tandem.sidecars.trainer.engines.heads import shift_to_labels
from tandem.sidecars.trainer.engines.interface import TrainerEngine
from tandem.sidecars.trainer.engines.select import build_engine
from tandem.sidecars.trainer.loop import persist, resume, sharded, train_state
from tandem.sidecars.trainer.loop.dataset import PromptDataset
from tandem.sidecars.trainer.loop.evaluate import EvalResult, Evaluator
from tandem.sidecars.trainer.loop.host_wait import broadcast as host_broadcast
from tandem.sidecars.trainer.loop.persist import Persister
from tandem.sidecars.trainer.loop.reference import ReferenceWeights
from tandem.sidecars.trainer.loop.rollout_client import RolloutClient
from tandem.sidecars.trainer.observe.prom import LoopMetrics
from tandem.sidecars.trainer.observe.timing import PhaseTimer
from tandem.sidecars.trainer.observe.tracking import Tracker
from tandem.spec import devices
from tandem.spec.models import RLHFJob
from tandem.spec.podenv import PodEnv
from tandem.spec.progress import EvalSummary, Phase, Progress

log = logging.getLogger(__name__)


@dataclass
class TrainerContext:
    env: PodEnv
    job: RLHFJob
    engine: TrainerEngine
    reference: ReferenceWeights | None
    algorithm: Algorithm
    rewards: RewardSet
    dataset: PromptDataset
    eos_id: int
    pad_id: int
    seed: int = 0
    critic: TrainerEngine | None = None  # PPO with critic: true
    registry: SyncRegistry | None = None
    publisher: Publisher | None = None
    rollouts: RolloutClient | None = None
    first_iteration: int = 0
    version: int = -1  # the weight version every rollout has loaded
    resumed: tuple[int, int] | None = None  # (version loaded, first iteration) on resume
    durable: DurableStore | None = None  # checkpointEngine.persist's store (every rank)
    persister: Persister | None = None  # its background weight copies (driver rank)
    prom: LoopMetrics | None = None  # Prometheus view of the loop (driver rank)
    evaluator: Evaluator | None = None  # spec.eval (driver rank)
    tracker: Tracker | None = None  # TensorBoard / MLflow (driver rank)
    last_sync: float | None = None
    last_kl: float | None = None
    last_turns: dict[str, float] = field(default_factory=dict)  # multi-turn: turns and tool calls, last iteration
    last_agreement: dict[str, float] = field(default_factory=dict)  # mismatch_kl, mismatch_ess, staleness_mean
    last_guard: str = ""  # algorithm.mismatchGuard's latest warning (progress record, the job's status)
    last_eval: EvalResult | None = None
    last_publish_path: Path | None = None  # the shm directory of the newest version (driver rank)
    last_publish_bytes: int = 0  # its size (driver rank; 0 on the others)
    tokenizer: Any = None  # decodes completions generated in several segments (partial rollouts)
    teacher: ReferenceWeights | None = None  # algorithm.distillation's teacher, scored as the reference is

    # ---- construction ----------------------------------------------------------------------
    @classmethod
    def create(cls, env: PodEnv, job: RLHFJob) -> TrainerContext:
        from transformers import AutoTokenizer

        spec = job.spec
        engine = build_engine(spec, seed=spec.seed)
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
        ctx = cls(env, job, engine, reference, algorithm, RewardSet(spec.rewards),
                  PromptDataset.load(spec.dataset, tok, seed=spec.seed), eos, pad, seed=spec.seed, critic=critic,
                  tokenizer=tok, teacher=teacher)
        if ctx.is_driver:
            if spec.eval is not None:
                ctx.evaluator = Evaluator(spec.eval, PromptDataset.load(spec.eval.dataset, tok).prompts, spec.rewards,
                                          max_tokens=spec.rollout.max_tokens, iterations=spec.algorithm.iterations,
                                          multi_turn=spec.rollout.environment is not None
                                          and spec.rollout.environment.type != "single")
            ctx.tracker = Tracker.create(spec.tracking, env.output_dir, env.job,
                                         job.spec.model_dump(mode="json", by_alias=True, exclude_none=True))
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
                                         on_wait=ctx.waiting)
            ctx.rollouts.names.update(resume.rollout_pods(registry, generation))
        return ctx

    @property
    def is_driver(self) -> bool:
        return not dist.is_initialized() or dist.get_rank() == 0

    def close(self, failed: bool = False) -> None:
        if self.tracker is not None:
            self.tracker.close(failed=failed)
        if self.persister is not None:
            self.persister.close()
        if self.rollouts is not None:
            self.rollouts.close()
        if self.registry is not None:
            self.registry.close()

    # ---- versions --------------------------------------------------------------------------
    def start_version(self) -> int:
        """Publish the starting weights (initial, or resumed from shm) as a fresh version; sync rollouts."""
        previous = None
        if self.resumed is not None:
            previous, self.first_iteration = self.resumed
        wanted = None if previous is None else previous + 1
        if wanted is not None and self.publisher is not None:  # the old lease may still hold newer records
            wanted = max(wanted, self.publisher.next_version())
        version = self.publish(wanted)
        self.offload()  # the loop onloads before each train phase
        if self.is_driver:
            self.report("sync", self.first_iteration, version)
            self.last_sync = self.sync(version, initial=True)
        return version

    @property
    def offloads(self) -> bool:
        """Whether the state moves around rollouts: `trainer.offload`, on an accelerator only. On a
        CPU the "host" is the memory the state already lives in: a copy would free nothing and hold
        a second copy of every parameter, gradient and Adam moment."""
        return moves_state(self.job.spec.trainer.offload, common.device())

    def onload(self) -> None:
        """Bring the trainer's models back to the accelerator (policy, and critic if any), unless
        the state never left (`offloads`)."""
        if not self.offloads:
            return
        for engine in (self.engine, self.critic):
            if engine is not None:
                engine.onload()

    def offload(self) -> None:
        """Free the accelerator for the rollouts: policy and critic state to host memory, where
        `offloads` (not with `trainer.offload: false`, and not on a CPU-only pod)."""
        if not self.offloads:
            return
        for engine in (self.engine, self.critic):
            if engine is not None:
                engine.offload()

    def persist(self, iteration: int, version: int) -> dict[str, Any]:
        """If a durable copy is due after `iteration`: every rank writes its training state (now),
        then the driver starts copying the weights of `version` (in the background)."""
        spec = self.job.spec.checkpoint_engine.persist
        if self.durable is None or spec is None or not persist.due(iteration + 1, spec.every,
                                                                   self.job.spec.algorithm.iterations):
            return {}
        info = train_state.save(self, version)
        if self.persister is not None:
            info |= self.persister.after_publish(iteration, version)
        return info

    def publish(self, version: int | None) -> int:
        """Export HF weights from every rank (with trainer.lora.sync adapter the adapters alone); the driver
        writes them to shm and registers them."""
        dtype = getattr(torch, devices.trainer_dtype(self.job.spec))  # the rollout's check wants exactly it
        adapter: dict[str, Any] | None = None
        if devices.adapter_sync(self.job.spec):
            exported = self.engine.export_adapters()
            adapter = self.engine.adapter_config()
        else:
            exported = self.engine.export_hf(target_tp=1, target_rank=0)
        named = ((n, t if t.dtype == dtype else t.to(dtype)) for n, t in exported)
        if self.publisher is None:
            for _ in named:  # collective: non-driver ranks take part in the gathers
                pass
            return -1 if version is None else version
        report = self.publisher.publish(version, named, adapter=adapter)
        self.last_publish_path, self.last_publish_bytes = Path(report.path), report.bytes
        return report.version

    def export(self, iteration: int, version: int) -> dict[str, Any]:
        """spec.export: after every `every`-th iteration and the last, the published version as a HF directory."""
        spec = self.job.spec.export
        done = iteration + 1
        if spec is None or self.last_publish_path is None or not persist.due(done, spec.every,
                                                                              self.job.spec.algorithm.iterations):
            return {}
        from tandem.checkpoint_engine.hf_export import export_version

        dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
        t = time.perf_counter()
        target = export_version(self.last_publish_path, Path(self.job.spec.model.path),
                                Path(spec.path) / f"iteration-{done}", dtype=dtypes.get(spec.dtype))
        adapter: Path | None = target / "adapter"
        if not (target / "adapter").is_dir():  # an adapter version exports its adapters itself
            write_adapter = getattr(self.engine, "write_adapter", None)  # trainer.lora merged: the adapters too
            adapter = write_adapter(target / "adapter") if write_adapter is not None else None
        log.info("exported version %d (after %d iterations) to %s%s", version, done, target,
                 f" (PEFT adapter in {adapter})" if adapter is not None else "")
        row = {"path": str(target), "version": version, "seconds": time.perf_counter() - t}
        return {"export": row | ({"adapter": str(adapter)} if adapter is not None else {})}

    def evaluate(self, iterations_done: int, version: int) -> EvalResult | None:
        """spec.eval, when due after `iterations_done` iterations: pass@1/pass@k on the live rollouts."""
        if self.evaluator is None or self.rollouts is None or not self.evaluator.due(iterations_done):
            return None
        self.report("eval", iterations_done, version)
        result = self.evaluator.run(self.rollouts, iterations_done, version)
        self.last_eval = result
        if self.prom is not None:
            self.prom.observe_eval(result.row())
        if self.tracker is not None:
            self.tracker.log(iterations_done, {"eval": result.row()})
        if self.env.output_dir is not None:
            with open(self.env.output_dir / "eval.jsonl", "a") as f:
                f.write(json.dumps(result.row()) + "\n")
        log.info("eval after %d iterations (version %d): pass@1 %.3f pass@%d %.3f on %d prompts", iterations_done,
                 version, result.pass_at_1, result.samples, result.pass_at_k, result.prompts)
        return result

    def sync(self, version: int, initial: bool = False, load: bool = True) -> float:
        """Every rollout loads `version` (restarting vLLM first if it was terminated); with `load`
        False (shared asynchronous rollouts load it themselves) only the driver's view moves."""
        if self.rollouts is None:
            return 0.0
        if not load:
            self.version = version
            return 0.0
        t = time.perf_counter()
        mode = self.job.spec.rollout.between_rollouts
        if mode == "terminate" and not initial:
            self.rollouts.start(self.job.spec.model.path, dummy=True)
        elif mode == "sleep" and not initial:
            self.rollouts.wake_up()
        self.rollouts.update(version)
        self.version = version
        self.last_sync = time.perf_counter() - t
        return self.last_sync

    def release_rollouts(self) -> None:
        """Free the accelerator for training as the spec asks (terminate or sleep vLLM)."""
        if self.rollouts is None:
            return
        mode = self.job.spec.rollout.between_rollouts
        if mode == "terminate":
            self.rollouts.terminate()
        elif mode == "sleep":
            self.rollouts.sleep(devices.sleep_level(self.job.spec))  # rollout.sleepLevel (auto: 2)

    # ---- phases ------------------------------------------------------------------------------
    def broadcast(self, obj: Any) -> Any:
        """Rank 0's object on every rank; the others wait on the host (`host_wait`), not in NCCL."""
        return host_broadcast(obj)

    def _pack(self, samples: list[Sample]) -> PackedBatch:
        return self.algorithm.prepare(samples, self.token_budget(samples))

    def token_budget(self, samples: list[Sample]) -> int:
        return row_budget(samples, share_prompts=self.job.spec.trainer.share_prompts, hidden=self.engine.shape.hidden)

    def inference(self, samples: list[Sample], inputs: list[RewardInput],
                  scored: tuple[list[float], dict[str, list[float]]] | None = None) -> dict[str, Any]:
        """Reference log-probs (collective) overlapped with rewards (driver); fills the samples. Rewards
        already computed (`scored`: dynamic sampling's) are used as they are.

        With data parallelism each dp rank runs the forwards on its share of the packed rows and
        the per-sample results are gathered over the dp group, so every rank ends with all of them.
        """
        from tandem.sidecars.algorithms.base import pack_samples

        packed = pack_samples(samples, self.token_budget(samples), pad_id=self.pad_id,
                              share_prompts=self.job.spec.trainer.share_prompts)
        need_old = self.algorithm.needs_old_logprobs or self.job.spec.algorithm.epochs > 1
        forwards = [self.reference, self.engine if need_old else None, self.critic, self.teacher]

        def model_work() -> list[dict[int, list[float]]]:
            """Reference, old-policy and teacher log-probs, critic values: per sample, collective forwards."""
            return sharded.per_sample_outputs(
                [None if e is None else partial(e.token_logprobs, scored_only=True) for e in forwards],
                packed, self.engine.par)

        info: dict[str, Any] = {}
        if self.is_driver and scored is not None:
            (ref, old, values, teacher), rewards = model_work(), scored[0]
            info["reward_components"] = {k: sum(v) / len(v) for k, v in scored[1].items() if v}
        elif self.is_driver:
            result = overlapped(self.rewards, inputs, model_work)
            (ref, old, values, teacher), rewards = result.model_result, result.rewards
            info["overlap_fraction"] = result.timings.overlap_fraction
            info["reward_components"] = {k: sum(v) / len(v) for k, v in result.components.items()}
        else:
            (ref, old, values, teacher), rewards = model_work(), []
        rewards = self.broadcast(rewards)
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

    def train(self, samples: list[Sample]) -> dict[str, float]:
        """`epochs` passes over the iteration's samples, `globalBatchSize` samples per optimizer step."""
        spec = self.job.spec
        batch = self._pack(samples)
        if batch.num_rows == 0:  # e.g. DPO when every group's rewards tie: nothing to learn from
            return {"skipped_train": 1.0}
        trained = sum(not s.kl_probe for s in samples)  # KTO's KL probes only set its reference point
        steps = max(1, math.ceil(trained / spec.trainer.global_batch_size))
        sums: dict[str, float] = {}
        first: dict[str, float] = {}
        n = 0
        for _ in range(spec.algorithm.epochs):
            for part in batch.split(steps):
                m = self.engine.train_step(part, self._loss(steps), reduction="sum")
                if self.critic is not None:  # the value loss on the same rows, returns from this batch
                    c = self.critic.train_step(part, self._loss(steps, critic=True), reduction="sum")
                    m |= {"value_loss": c["value_loss"], "value_clip_frac": c["value_clip_frac"],
                          "critic_grad_norm": c["grad_norm"]}
                for k, v in m.items():
                    sums[k] = sums.get(k, 0.0) + v
                first = first or dict(m)
                n += 1
        out = {k: v / n for k, v in sums.items() if not k.startswith("rc_")}
        out |= {f"prepare_{k}": v for k, v in batch.stats.items()}
        # the rollout/trainer mismatch is measured before any update: the first step's weights (its rc_ sums
        # become the batch's mismatch_kl, ESS and clipped/masked shares)
        out |= summarize_correction({k: v for k, v in first.items() if k.startswith(("mismatch_", "tis_", "rc_"))})
        self.last_kl = out.get("kl")
        return out

    def _loss(self, steps: int, critic: bool = False) -> Any:
        """Per-micro-batch loss: the algorithm's (or its critic loss, on values), on outputs shifted to
        its next-token layout.

        The algorithm's micro-batch losses add up to the loss of the packed batch (weights are
        global), hence reduction="sum"; each of the `steps` optimizer steps sees 1/steps of them.
        """
        loss_of: Callable[[torch.Tensor, PackedBatch], tuple[torch.Tensor, dict[str, float]]] = self.algorithm.loss
        if critic:  # the capability that comes with needs_values (PPO with a learned critic)
            critic_loss = getattr(self.algorithm, "critic_loss", None)
            if not self.algorithm.needs_values or critic_loss is None:
                raise TypeError(f"{self.algorithm.name} has no critic loss")
            loss_of = critic_loss

        def loss_fn(out: torch.Tensor, mb: PackedBatch) -> tuple[torch.Tensor, dict[str, float]]:
            loss, metrics = loss_of(shift_to_labels(out), mb)
            return loss * steps, metrics

        return loss_fn

    # ---- reporting ---------------------------------------------------------------------------
    def report(self, phase: Phase, iteration: int, version: int, *, reward: float | None = None,
               message: str = "") -> None:
        if not self.is_driver or self.registry is None:
            return
        p = Progress(phase=phase, iteration=iteration, iterations=self.job.spec.algorithm.iterations,
                     weight_version=version, last_sync_seconds=self.last_sync, reward_mean=reward,
                     kl=self.last_kl, message=message, updated_at=time.time(), eval=self._eval_summary(),
                     turns_mean=self.last_turns.get("turns_mean"),
                     tool_calls_mean=self.last_turns.get("tool_calls_mean"),
                     mismatch_kl=self.last_agreement.get("mismatch_kl"), ess=self.last_agreement.get("mismatch_ess"),
                     staleness_mean=self.last_agreement.get("staleness_mean"), guard=self.last_guard)
        if reward is None:
            old = self.registry.get_json(keys.progress(self.registry.namespace, self.registry.scope))
            p.reward_mean = None if old is None else old.get("rewardMean")
        self.registry.put_json(keys.progress(self.registry.namespace, self.registry.scope), json.loads(p.to_json()))

    def waiting(self, reason: str) -> None:
        """No healthy rollout (the client waits for one): the reason in the job's progress record, which
        the operator shows in its status and `tandem run` in its table; the phase and figures stay."""
        if not self.is_driver or self.registry is None:
            return
        key = keys.progress(self.registry.namespace, self.registry.scope)
        try:
            old = self.registry.get_json(key) or {}
            self.registry.put_json(key, {**old, "message": reason, "updatedAt": time.time()})
        except Exception as e:  # noqa: BLE001 - etcd away too: the wait goes on, the log says why
            log.warning("could not record the wait in etcd: %s", e)
        log.warning("%s", reason)

    def _eval_summary(self) -> EvalSummary | None:
        e = self.last_eval
        if e is None:
            return None
        return EvalSummary(iteration=e.iteration, weight_version=e.version, pass_at_1=e.pass_at_1,
                           pass_at_k=e.pass_at_k, k=e.samples, prompts=e.prompts)

    def record(self, iteration: int, version: int, info: dict[str, Any], timer: PhaseTimer) -> None:
        if not self.is_driver:
            return
        self.last_turns = {k: info[k] for k in ("turns_mean", "tool_calls_mean") if k in info}
        self.last_agreement = {k: float(info[k]) for k in ("mismatch_kl", "mismatch_ess", "staleness_mean")
                               if info.get(k) is not None}
        guard = info.get("mismatch_guard", {})
        self.last_guard = guard.get("message", "") if guard.get("action") in ("warn", "pause") else ""
        row = {"iteration": iteration, "weight_version": version, **info,
               "seconds": timer.seconds, "total_seconds": timer.total,
               "switch_share": timer.share(("offload", "onload", "publish", "sync", "release")),
               "layout": {k: getattr(self.engine.par, k) for k in ("tp", "pp", "dp", "ep")},  # trainer ranks
               "engine": devices.trainer_engine(self.job.spec)}
        if timer.memory is not None:
            row["memory"] = timer.memory.summary()
        if self.prom is not None:
            self.prom.observe(row)
        if self.tracker is not None:
            self.tracker.log(iteration, row)
        if self.env.output_dir is not None:
            with open(self.env.output_dir / "metrics.jsonl", "a") as f:
                f.write(json.dumps(row) + "\n")
        log.info("iteration %d: reward %.3f kl %s sync %.2fs", iteration, info.get("reward_mean", 0.0),
                 info.get("kl"), info.get("sync_seconds", 0.0))


def moves_state(offload: bool, device: torch.device) -> bool:
    """`trainer.offload` on a device whose memory an offload frees (an accelerator, not the host)."""
    return offload and device.type != "cpu"


def serve_control_api(publisher: Publisher, env: PodEnv, prom: LoopMetrics) -> None:
    """The trainer's checkpoint-engine API (status, gc, /metrics) on TANDEM_CE_PORT, in a daemon thread."""
    from tandem.checkpoint_engine.api import create_app
    from tandem.sidecars.serve import start_server

    start_server(create_app(publisher, env.token, prom.registry), env.port, "trainer-api")
