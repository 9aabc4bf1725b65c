"""Worker processes and shared checks of the multi-rank trainer tests (gloo on CPU).

Started by tests/trainer/test_megatron_parallel.py (two ranks: TP=2, PP=2, EP=2, DP=2) and
test_megatron_parallel_4ranks.py (four: TP2xPP2, TP2xEP2) with torch.multiprocessing (spawn); each
rank builds a MegatronEngine per layout, runs the same fixed script, and saves what it saw to
``out/tp{tp}pp{pp}ep{ep}-rank{r}.pt`` for the test process to compare with a single-rank engine
(`assert_same_after_adam`, `assert_vllm_tp2_slice`); with `replay`, a MoE layout also runs `replay_script`
(routing replay on a fresh engine). test_distributed_optimizer.py's ranks run `distopt_run` (in
distopt_worker.py) after `join`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch


def fixed_batch() -> dict[str, torch.Tensor]:
    """Two packed rows with three samples; the same on every rank and in the test process."""
    gen = torch.Generator().manual_seed(7)
    ids = torch.randint(0, 128, (2, 12), generator=gen)
    seg = torch.tensor([[1] * 5 + [2] * 7, [1] * 9 + [0] * 3])
    return {"input_ids": ids * (seg != 0), "segment_ids": seg}


def nll_loss(
    logprobs: torch.Tensor, batch: Mapping[str, torch.Tensor]
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Mean negative log-likelihood of every non-first token of every sample (per micro-batch)."""
    seg = batch["segment_ids"]
    mask = torch.zeros_like(logprobs)
    mask[:, 1:] = ((seg[:, 1:] == seg[:, :-1]) & (seg[:, 1:] != 0)).float()
    loss = -(logprobs * mask).sum() / mask.sum().clamp(min=1)
    return loss, {"tokens": mask.sum()}


def value_mse(values: torch.Tensor, batch: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, Any]]:
    """A critic's squared error to per-sample targets (1.0 for segment 1, -0.5 otherwise)."""
    seg = batch["segment_ids"]
    mask = torch.zeros_like(values)
    mask[:, 1:] = ((seg[:, 1:] == seg[:, :-1]) & (seg[:, 1:] != 0)).float()
    target = torch.where(seg == 1, 1.0, -0.5)
    return ((values - target) ** 2 * mask).sum() / mask.sum().clamp(min=1), {}


def critic_script(model_dir: str, tp: int) -> dict[str, Any]:
    """A value-head engine at tensor parallelism `tp`: its values before and after 3 steps."""
    from tandem.sidecars.trainer.engines.megatron_engine import MegatronEngine

    critic = MegatronEngine.from_hf(model_dir, tensor_parallel=tp, lr=1e-2, seed=0, value_head=True)
    batch = fixed_batch()
    out: dict[str, Any] = {"values0": critic.token_logprobs(batch)}
    out["losses"] = [critic.train_step(batch, value_mse, micro_batch_size=1)["loss"] for _ in range(3)]
    out["values"] = critic.token_logprobs(batch)
    return out


DP_SCRIPT = ((3, "mean"), (1, "sum"), (5, "sum"))  # (rows, reduction): uneven shares, an empty rank


def rows_batch(rows: int) -> dict[str, torch.Tensor]:
    """`rows` packed rows of two samples each (deterministic)."""
    gen = torch.Generator().manual_seed(100 + rows)
    ids = torch.randint(1, 128, (rows, 10), generator=gen)
    seg = torch.tensor([[1] * 4 + [2] * 6] * rows)
    return {"input_ids": ids, "segment_ids": seg}


def sharded_forward(engine: Any) -> dict[str, Any]:
    """Per-sample log-probs of a packed batch of 5 rows, computed on each dp rank's share and gathered."""
    from tandem.sidecars.algorithms.algorithm_interface import Sample, pack_samples
    from tandem.sidecars.trainer.loop.forwards import sharded

    gen = torch.Generator().manual_seed(11)
    samples = [Sample(prompt_ids=torch.randint(1, 128, (8,), generator=gen).tolist(),
                      completion_ids=torch.randint(1, 128, (4 + i,), generator=gen).tolist(), group=i // 2)
               for i in range(5)]
    packed = pack_samples(samples, 24, pad_id=0)
    seen: list[int] = []

    def forward(rows: Any) -> torch.Tensor:
        seen.append(rows.num_rows)
        return torch.as_tensor(engine.token_logprobs(rows))

    lp, skipped = sharded.per_sample_outputs([forward, None], packed, engine.par)
    return {"rows": packed.num_rows, "logprobs": lp, "skipped": skipped, "forward_rows": seen}


def dp_script(engine: Any) -> list[dict[str, Any]]:
    """Further train steps whose global batches split unevenly over two data-parallel ranks."""
    out = []
    for rows, reduction in DP_SCRIPT:
        metrics = engine.train_step(rows_batch(rows), nll_loss, micro_batch_size=1, reduction=reduction)
        out.append({"metrics": metrics, "rows": engine.last_step_rows})
    return out


def copy_tensors(tensors: Iterable[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in tensors}  # exports may alias live parameters


def scored_batch() -> dict[str, torch.Tensor]:
    """Two rows of 11 tokens (odd: sequence parallelism pads them) with a `loss_mask` in the labels
    layout scoring each sample's tokens after its first two, as the algorithms' packed batches do."""
    from tandem.sidecars.trainer.engines.micro_batches import position_ids

    gen = torch.Generator().manual_seed(5)
    seg = torch.tensor([[1] * 4 + [2] * 7, [1] * 8 + [0] * 3])
    ids = torch.randint(1, 128, (2, 11), generator=gen) * (seg != 0)
    labels = torch.cat([ids[:, 1:], torch.zeros_like(ids[:, :1])], dim=1)
    next_same = torch.zeros_like(seg, dtype=torch.bool)  # token t + 1 belongs to t's sample
    next_same[:, :-1] = (seg[:, 1:] == seg[:, :-1]) & (seg[:, 1:] != 0)
    return {"input_ids": ids, "segment_ids": seg, "labels": labels,
            "loss_mask": (next_same & (position_ids(seg) >= 1)).float()}


def scored_nll(logprobs: torch.Tensor, batch: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, Any]]:
    """Mean negative log-likelihood of the scored tokens (the engine leaves 0 elsewhere)."""
    return -logprobs.sum() / batch["loss_mask"].sum(), {}


def scored_script(model_dir: str | Path, tp: int = 1, pp: int = 1, ep: int = 1) -> dict[str, Any]:
    """A fresh engine's log-probs of every position and of the scored ones only, then its train step on
    the scored ones (before any other step: Adam's noise would blur the comparison)."""
    from tandem.sidecars.trainer.engines.megatron_engine import MegatronEngine

    engine = MegatronEngine.from_hf(model_dir, tensor_parallel=tp, pipeline_parallel=pp, expert_parallel=ep,
                                    lr=1e-2, seed=0)
    batch = scored_batch()
    return {"all": engine.token_logprobs(batch), "scored": engine.token_logprobs(batch, scored_only=True),
            "train": engine.train_step(batch, scored_nll, micro_batch_size=1)}


def replay_batch() -> dict[str, torch.Tensor]:
    """`scored_batch` (rows of 11 tokens: sequence parallelism pads them to 12) with a random top-2 of 4
    experts per token and layer as its `routed_experts` (so they differ from what the routers would choose)."""
    batch = scored_batch()
    gen = torch.Generator().manual_seed(11)
    rows, cols = batch["input_ids"].shape
    routed = torch.stack([torch.randperm(4, generator=gen)[:2] for _ in range(rows * cols * 2)])
    batch["routed_experts"] = routed.reshape(rows, cols, 2, 2).to(torch.uint8)
    return batch


def replay_script(model_dir: str | Path, tp: int = 1, pp: int = 1, ep: int = 1) -> dict[str, Any]:
    """A fresh engine with routing replay: scored log-probs without and with the batch's routing (the routing
    map each router produced in the replayed forward, one forward of both rows), then a replayed train step."""
    from megatron.core import parallel_state as ps

    from tandem.sidecars.trainer.engines.megatron_engine import MegatronEngine

    engine = MegatronEngine.from_hf(model_dir, tensor_parallel=tp, pipeline_parallel=pp, expert_parallel=ep,
                                    lr=1e-2, seed=0, routing_replay=True)
    batch = replay_batch()
    plain = {k: v for k, v in batch.items() if k != "routed_experts"}
    maps: dict[int, torch.Tensor] = {}
    handles = [router.register_forward_hook(lambda _m, _a, out, layer=layer: maps.__setitem__(layer, out[1].clone()))
               for layer, router in engine._routers]
    replayed = engine.token_logprobs(batch, micro_batch_size=2, scored_only=True)
    for h in handles:
        h.remove()
    return {"plain": engine.token_logprobs(plain, scored_only=True), "replayed": replayed, "maps": maps,
            "train": engine.train_step(batch, scored_nll, micro_batch_size=1),
            "tp_rank": ps.get_tensor_model_parallel_rank(), "ep_rank": ps.get_expert_model_parallel_rank()}


def single_rank_script(model_dir: str | Path, scored: bool = False) -> dict[str, Any]:
    """What one rank (TP=PP=EP=1) sees of the fixed script: logits, a train step, the export after it,
    and with `scored` then `scored_script`."""
    from tandem.sidecars.trainer.engines.megatron_engine import MegatronEngine

    engine = MegatronEngine.from_hf(model_dir, lr=1e-2, seed=0)
    batch = fixed_batch()
    logits = engine.logits(batch)
    train = engine.train_step(batch, nll_loss, micro_batch_size=1)
    seen = {"logits": logits, "train": train, "export_after": copy_tensors(engine.export_hf())}
    return seen | ({"scored": scored_script(model_dir)} if scored else {})


def assert_same_after_adam(got: torch.Tensor, want: torch.Tensor, name: str, steps: int, noisy: float) -> None:
    """Weights after `steps` Adam steps (lr 1e-2) equal up to summation-order noise.

    Adam's step is about lr * sign(grad): noise in a near-zero gradient can move a rare element by
    up to lr per step (measured: one of 12288 in an EP=2 expert by 5.04e-4, one of 32 in a bias by
    1.1e-5). A wrong layout moves many elements by about lr. So: no element beyond what Adam can do,
    at most one in a thousand beyond 5e-4, and at most a `noisy` share (two elements in a small
    tensor) beyond 1e-5."""
    d = (got - want).abs()
    assert d.max().item() <= 2 * steps * 1e-2, (name, d.max().item())
    assert int(d.gt(5e-4).sum()) <= max(1, d.numel() // 1000), (name, int(d.gt(5e-4).sum()))
    assert int(d.gt(1e-5).sum()) <= max(2, int(noisy * d.numel())), (name, int(d.gt(1e-5).sum()))


def spawn_layouts(model_dirs: Mapping[str, Path], layouts: list[tuple[str, int, int, int]], world: int,
                  out: Path, scored: bool = False,
                  replay: bool = False) -> dict[tuple[str, int, int, int], list[dict[str, Any]]]:
    """`run` on `world` spawned gloo ranks for each (family, tp, pp, ep) layout; what each rank saw, by layout."""
    import torch.multiprocessing as mp

    from tandem.checkpoint_engine.etcd.local_etcd import free_port

    dirs = [(str(model_dirs[f]), tp, pp, ep) for f, tp, pp, ep in layouts]
    mp.start_processes(run, args=(world, free_port(), str(out), dirs, scored, replay), nprocs=world,
                       start_method="spawn")
    return {(f, tp, pp, ep): [torch.load(out / f"tp{tp}pp{pp}ep{ep}-rank{r}.pt", weights_only=False)
                              for r in range(world)] for f, tp, pp, ep in layouts}


def assert_export_is_hf(seen: list[dict[str, Any]], want: Mapping[str, torch.Tensor]) -> None:
    """Rank 0 exported exactly the HF checkpoint's tensors; every other rank exported nothing."""
    rank0, *others = seen
    assert all(s["export"] == {} for s in others)
    assert sorted(rank0["export"]) == sorted(want)
    for name, tensor in want.items():
        assert torch.equal(rank0["export"][name], tensor), name


def assert_matches_single_rank(seen: list[dict[str, Any]], one: Mapping[str, Any]) -> None:
    """Every rank's logits, loss and grad norm as one rank's; rank 0's weights after the step too."""
    for s in seen:
        assert (s["logits"] - one["logits"]).abs().max().item() < 1e-5
        assert abs(s["train"]["loss"] - one["train"]["loss"]) < 1e-5
        assert abs(s["train"]["grad_norm"] - one["train"]["grad_norm"]) < 1e-4
    after = seen[0]["export_after"]
    assert sorted(after) == sorted(one["export_after"])
    for name, tensor in one["export_after"].items():
        assert_same_after_adam(after[name], tensor, name, steps=1, noisy=0.01)


def assert_vllm_tp2_slice(part: dict[str, torch.Tensor], full: dict[str, torch.Tensor], r: int) -> None:
    """Rollout rank r's slice of a tiny Qwen2 follows vLLM's layout: q/k/v and gate/up by rows, o/down by
    columns, norms whole, the (128-row) embedding by rows."""
    p = "model.layers.1."
    assert sorted(part) == sorted(full)
    for name in ("self_attn.q_proj.weight", "self_attn.k_proj.bias", "mlp.gate_proj.weight", "mlp.up_proj.weight"):
        rows = full[p + name].shape[0] // 2
        assert torch.equal(part[p + name], full[p + name][r * rows : (r + 1) * rows]), name
    for name in ("self_attn.o_proj.weight", "mlp.down_proj.weight"):
        cols = full[p + name].shape[1] // 2
        assert torch.equal(part[p + name], full[p + name][:, r * cols : (r + 1) * cols]), name
    assert torch.equal(part[p + "input_layernorm.weight"], full[p + "input_layernorm.weight"])
    # vocab 128 pads to 128 (multiple of 64): 64 rows per rank
    assert torch.equal(part["model.embed_tokens.weight"], full["model.embed_tokens.weight"][r * 64 : (r + 1) * 64])


def join(rank: int, world: int, port: int) -> None:
    """Make this spawned process rank `rank` of `world` (env:// rendezvous, as the sidecar's launcher does)."""
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    torch.set_num_threads(1)


def run(rank: int, world: int, port: int, out_dir: str, layouts: list[tuple[str, int, int, int]],
        scored: bool = False, replay: bool = False) -> None:
    """Build an engine for each (model_dir, tp, pp, ep) layout in turn; save what rank ``rank`` saw
    (with `scored`, also `scored_script`; with `replay`, a MoE layout (ep > 1) also `replay_script`)."""
    join(rank, world, port)
    from megatron.core import parallel_state

    from tandem.sidecars.trainer.engines.megatron_engine import MegatronEngine

    for model_dir, tp, pp, ep in layouts:
        engine = MegatronEngine.from_hf(
            model_dir, tensor_parallel=tp, pipeline_parallel=pp, expert_parallel=ep, lr=1e-2, seed=0
        )
        result: dict[str, Any] = {
            "export": copy_tensors(engine.export_hf()),
            "export_seconds": engine.last_export_seconds,
        }
        for target in range(2):
            result[f"slice{target}"] = copy_tensors(engine.export_hf(target_tp=2, target_rank=target))
        batch = fixed_batch()
        if tp * pp * ep == 1:  # before any training: the same weights as the single-rank engine
            result["sharded"] = sharded_forward(engine)
        result["logits"] = engine.logits(batch)
        result["logprobs"] = engine.token_logprobs(batch)
        result["train"] = engine.train_step(batch, nll_loss, micro_batch_size=1)
        result["export_after"] = copy_tensors(engine.export_hf())
        result["train_rows"] = engine.last_step_rows
        if scored:
            result["scored"] = scored_script(model_dir, tp, pp, ep)
        if replay and ep > 1:
            result["replay"] = replay_script(model_dir, tp, pp, ep)
        if (tp, pp, ep) == (2, 1, 1):  # a critic's value head lives on tensor-parallel rank 0 only
            result["critic"] = critic_script(model_dir, tp)
        if tp * pp * ep == 1:  # two ranks, one model copy each: data parallelism
            result["dp"] = dp_script(engine)
            result["export_dp"] = copy_tensors(engine.export_hf())
        result["local_names"] = [n for n, _ in engine.named_parameters()]
        torch.save(result, Path(out_dir) / f"tp{tp}pp{pp}ep{ep}-rank{rank}.pt")
        torch.distributed.barrier()
        parallel_state.destroy_model_parallel()
    torch.distributed.destroy_process_group()
