"""The state the trainer's loop shares, built once per trainer process (`start.create`).

Role: what every phase reads or moves: the trainer engine (`engine`: Megatron or transformers + FSDP2, as
trainer.engine says; for PPO with `critic: true`, a value-head critic engine), reference and teacher
weights, algorithm, rewards, dataset, and — on the driver rank — the etcd registry, the shared-memory
publisher, the rollout client, the evaluator and the metrics sinks; with the loop's counters (the version
the rollouts hold, the latest figures its reports carry). The phases' work lives in their own modules
under `phases/` (`generate`, `switch`, `inference`, `train`, `publish`, `evaluate`, `report`), each taking the
context.
Every rank runs the collective phases in the same order; the driver alone talks to rollouts and etcd.
Callers: `driver.run` and the phase modules.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from tandem.checkpoint_engine.etcd.sync_registry import SyncRegistry
from tandem.checkpoint_engine.service.publisher import Publisher
from tandem.checkpoint_engine.versions.durable import DurableStore
from tandem.sidecars.algorithms.algorithm_interface import Algorithm, Sample, row_budget
from tandem.sidecars.rewards.combine import RewardSet
from tandem.sidecars.trainer.engines.interface import TrainerEngine
from tandem.sidecars.trainer.engines.vision_inputs import as_pictures
from tandem.sidecars.trainer.loop.data.dataset import PromptDataset
from tandem.sidecars.trainer.loop.forwards.reference import ReferenceWeights
from tandem.sidecars.trainer.loop.held_out import EvalResult, Evaluator
from tandem.sidecars.trainer.loop.host_wait import broadcast as host_broadcast
from tandem.sidecars.trainer.loop.recovery.persist import Persister
from tandem.sidecars.trainer.loop.rollout.rollout_client import RolloutClient
from tandem.sidecars.trainer.observe.prom import LoopMetrics
from tandem.sidecars.trainer.observe.tracking import Tracker
from tandem.spec.models import RLHFJob
from tandem.spec.podenv import PodEnv
from tandem.spec.progress import RolloutEngines


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
    rollout_engines: RolloutEngines | None = None  # restarts, rejoins, latest recovery (`report.engines_after`)
    last_eval: EvalResult | None = None
    last_publish_path: Path | None = None  # the shm directory of the newest version (driver rank)
    last_publish_bytes: int = 0  # its size (driver rank; 0 on the others)
    tokenizer: Any = None  # decodes completions generated in several segments (partial rollouts)
    teacher: ReferenceWeights | None = None  # algorithm.distillation's teacher, scored as the reference is
    image_processor: Any = None  # a vision-language model's (transformers'), which prepares pictures for it

    def pixels(self, images: tuple[Any, ...]) -> tuple[torch.Tensor, ...]:
        """A prompt's pictures as the model's pixel values (`[3, H, W]` each, or a grid of patches `[t, h, w, patch]`
        for Qwen2.5-VL: `vision_inputs.as_pictures`), prepared by the model's own image processor, as vLLM's
        processor prepares them for the rollout."""
        return as_pictures(self.image_processor(images=list(images), return_tensors="pt"))

    @property
    def is_driver(self) -> bool:
        return not dist.is_initialized() or dist.get_rank() == 0

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's object on every rank; the others wait on the host (`host_wait`), not in NCCL."""
        return host_broadcast(obj)

    def token_budget(self, samples: list[Sample]) -> int:
        """Tokens per packed row for these samples (the Inference and Train phases pack alike)."""
        return row_budget(samples, share_prompts=self.job.spec.trainer.share_prompts, hidden=self.engine.shape.hidden)

    def close(self, failed: bool = False) -> None:
        if self.tracker is not None:
            self.tracker.close(failed=failed)
        if self.persister is not None:
            self.persister.close()
        if self.rollouts is not None:
            self.rollouts.close()
        if self.registry is not None:
            self.registry.close()
