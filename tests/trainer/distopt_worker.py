"""Ranks of test_distributed_optimizer.py: two gloo ranks whose engines the trainer's start builds from a job.

Each rank (`run`, spawned by the test with torch.multiprocessing) joins a world of two CPU ranks, so
data parallelism is 2, and builds every engine with `tandem.sidecars.trainer.engines.engine_choice.build_engine`
from examples/tiny-grpo.yaml's spec with `replicas: 2`:

1. with `trainer.distributedOptimizer` false and true (float32), and true in bfloat16 (fp32 master
   weights apart from the model's), a policy and a PPO critic train three steps (an offload/onload
   between the first two, a durable training state saved after the second), then fresh engines with
   the saved weights and state take the third step again;
2. an unsharded pair tries to restore the sharded state (a layout change);
3. a Mixtral policy with `trainer.expertParallel: 2` takes one step.

What each rank saw goes to ``out/rank{r}.pt``.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import dist_worker
import torch
import torch.distributed as dist
import yaml

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny-grpo.yaml"
VERSION = 3
RUNS = (("plain", False, "float32"), ("sharded", True, "float32"), ("sharded_bf16", True, "bfloat16"))


def job_spec(model_dir: str, **trainer: Any) -> Any:
    """examples/tiny-grpo.yaml on `model_dir`, two CPU pods, lr 1e-2, one-row micro-batches, `trainer` fields."""
    from tandem.spec.load import parse_job

    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"].update(model={"path": model_dir}, replicas=2)
    doc["spec"]["algorithm"]["lr"] = 1e-2
    doc["spec"]["trainer"].update(microBatchSize=1, **trainer)
    return parse_job(doc).spec


def engines(spec: Any, store_dir: Path) -> Any:
    """A context as `train_state` sees it: policy, critic and a durable store, built from `spec`."""
    from tandem.checkpoint_engine.versions.durable import DurableStore
    from tandem.sidecars.trainer.engines.engine_choice import build_engine

    return SimpleNamespace(engine=build_engine(spec), critic=build_engine(spec, seed=1, value_head=True),
                           durable=DurableStore(store_dir, "ns", "job", "uid-1"))


def step(ctx: Any, batch: dict[str, torch.Tensor], reduction: str = "mean") -> dict[str, dict[str, float]]:
    policy = ctx.engine.train_step(batch, dist_worker.nll_loss, micro_batch_size=1, reduction=reduction)
    critic = ctx.critic.train_step(batch, dist_worker.value_mse, micro_batch_size=1, reduction=reduction)
    return {"policy": policy, "critic": critic}


def state_numel(engine: Any) -> int:
    """Elements of what this rank's optimizer holds: master weights and Adam's moments (what offload moves)."""
    from tandem.sidecars.trainer.engines.offload import optimizer_tensors

    return sum(t.numel() for t in optimizer_tensors(engine.optimizer))


def on_every_rank(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rank 0's export on every rank, as each rank reads a durable copy on resume."""
    box: list[Any] = [tensors]
    dist.broadcast_object_list(box, src=0)
    return dict(box[0])


def optimizer_script(spec: Any, store_dir: Path) -> dict[str, Any]:
    from tandem.sidecars.trainer.engines import megatron_build
    from tandem.sidecars.trainer.loop.recovery import train_state

    ctx = engines(spec, store_dir)
    seen: dict[str, Any] = {"sharded": train_state.sharded(ctx.engine)}
    steps = [step(ctx, dist_worker.rows_batch(3))]  # 1 and 2 rows: uneven shares
    seen["state_numel"] = state_numel(ctx.engine)
    for engine in (ctx.engine, ctx.critic):  # what the trainer does around each rollout phase
        engine.offload()
        engine.onload()
    steps.append(step(ctx, dist_worker.rows_batch(5), "sum"))
    weights = on_every_rank(dist_worker.copy_tensors(ctx.engine.export_hf()))
    seen["state_bytes"] = train_state.save(ctx, VERSION)["train_state_bytes"]
    steps.append(step(ctx, dist_worker.fixed_batch()))
    seen |= {"steps": steps, "after": dist_worker.copy_tensors(ctx.engine.export_hf()),
             "critic_after": dist_worker.copy_tensors(ctx.critic.named_parameters())}
    again = engines(spec, store_dir)  # a restarted trainer: the durable weights, then the training state
    megatron_build.load_hf_weights(again.engine.gpt, weights.__getitem__, again.engine.shape, again.engine.par)
    seen["restored"] = train_state.restore(again, VERSION)
    seen["resumed"] = step(again, dist_worker.fixed_batch())
    seen["resumed_after"] = dist_worker.copy_tensors(again.engine.export_hf())
    seen["resumed_critic"] = dist_worker.copy_tensors(again.critic.named_parameters())
    return seen


def expert_script(spec: Any) -> dict[str, Any]:
    from tandem.sidecars.trainer.engines.engine_choice import build_engine
    from tandem.sidecars.trainer.loop.recovery import train_state

    engine = build_engine(spec)
    names = [n for n, _ in engine.named_parameters()]
    return {"ep": engine.par.ep, "dp": engine.par.dp, "sharded": train_state.sharded(engine),
            "local_experts": sorted({n.split(".")[6] for n in names if ".local_experts." in n}),
            "train": engine.train_step(dist_worker.fixed_batch(), dist_worker.nll_loss, micro_batch_size=1),
            "export_after": dist_worker.copy_tensors(engine.export_hf())}


def run(rank: int, world: int, port: int, out_dir: str, model_dirs: dict[str, str]) -> None:
    dist_worker.join(rank, world, port)
    from megatron.core import parallel_state

    from tandem.sidecars.trainer.loop.recovery import train_state

    root = Path(out_dir)
    seen: dict[str, Any] = {}
    for run_name, sharded, dtype in RUNS:
        spec = job_spec(model_dirs["qwen2"], distributedOptimizer=sharded, dtype=dtype)
        seen[run_name] = optimizer_script(spec, root / f"store-{run_name}")
    plain = engines(job_spec(model_dirs["qwen2"], distributedOptimizer=False), root / "store-sharded")
    seen["plain_restores_sharded"] = train_state.restore(plain, VERSION)
    parallel_state.destroy_model_parallel()  # the expert-parallel groups differ
    seen["experts"] = expert_script(job_spec(model_dirs["mixtral"], expertParallel=2))
    torch.save(seen, root / f"rank{rank}.pt")
    dist.barrier()
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()
