"""`trainer.distributedOptimizer` and `trainer.expertParallel` reach Megatron: two gloo ranks on CPU.

One spawn of two processes (distopt_worker.run) builds every engine through the trainer's
`select.build_engine` from a job spec with two CPU pods (data parallelism 2). Megatron's distributed
optimizer must change where the optimizer state lives and nothing else: the same steps (policy and
PPO critic, uneven data-parallel shares, an offload/onload between steps) as the unsharded
optimizer, half the state per rank, and a durable training state (`train_state`) that a restarted
trainer restores to take the uninterrupted step (float32 and bfloat16); an unsharded run does not
restore it. A Mixtral
spec with `expertParallel: 2` builds an engine whose ranks hold half the experts each and whose
step equals one rank's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dist_worker
import distopt_worker
import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file
from tiny_models import make_tiny_hf_model

from tandem.checkpoint_engine.etcd.local_etcd import free_port

pytestmark = pytest.mark.megatron
WORLD = 2


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("tiny-hf")
    return {f: str(make_tiny_hf_model(root / f, family=f)) for f in ("qwen2", "mixtral")}


@pytest.fixture(scope="module")
def ranks(model_dirs: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("ranks")
    mp.start_processes(distopt_worker.run, args=(WORLD, free_port(), str(out), model_dirs), nprocs=WORLD,
                       start_method="spawn")
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


def _close(got: float, want: float, rel: float) -> bool:
    return abs(got - want) <= rel * max(1.0, abs(want))


def test_sharded_steps_equal_unsharded(ranks: list[dict[str, Any]], model_dirs: dict[str, str]) -> None:
    for seen in ranks:
        plain, sharded = seen["plain"], seen["sharded"]
        assert (plain["sharded"], sharded["sharded"]) == (False, True)
        for step, (want, got) in enumerate(zip(plain["steps"], sharded["steps"], strict=True)):
            for model in ("policy", "critic"):
                assert _close(got[model]["loss"], want[model]["loss"], 1e-5), (step, model)
                assert _close(got[model]["grad_norm"], want[model]["grad_norm"], 1e-4), (step, model)
                assert got[model]["update_ok"] == 1.0
        for name, tensor in sharded["critic_after"].items():
            dist_worker.assert_same_after_adam(tensor, plain["critic_after"][name], name, steps=3, noisy=0.02)
    plain, sharded = ranks[0]["plain"], ranks[0]["sharded"]
    assert ranks[1]["sharded"]["after"] == {}  # the export comes out on rank 0 only
    assert sorted(sharded["after"]) == sorted(plain["after"])
    for name, tensor in plain["after"].items():
        dist_worker.assert_same_after_adam(sharded["after"][name], tensor, name, steps=3, noisy=0.02)
    start = load_file(str(Path(model_dirs["qwen2"]) / "model.safetensors"))
    name = "model.layers.0.mlp.up_proj.weight"  # three steps at lr 1e-2 moved the weights
    assert (sharded["after"][name] - start[name]).abs().max() > 1e-2


def test_each_rank_holds_half_the_optimizer_state(ranks: list[dict[str, Any]]) -> None:
    """Master weights and Adam moments: half per rank, all of it between the two; smaller state files."""
    plain = [seen["plain"]["state_numel"] for seen in ranks]
    sharded = [seen["sharded"]["state_numel"] for seen in ranks]
    assert plain[0] == plain[1] > 0  # a full copy on every data-parallel rank
    assert sum(sharded) == plain[0]
    for part in sharded:
        assert 0.4 * plain[0] < part < 0.6 * plain[0], (part, plain[0])
    for seen in ranks:
        assert seen["sharded"]["state_bytes"] < seen["plain"]["state_bytes"]


@pytest.mark.parametrize("optimizer", [name for name, _, _ in distopt_worker.RUNS])
def test_restored_state_takes_the_uninterrupted_step(ranks: list[dict[str, Any]], optimizer: str) -> None:
    """Moments, step count and (bfloat16) the fp32 master weights come back: the same third step."""
    for seen in ranks:
        run = seen[optimizer]
        assert run["restored"] is True
        for model in ("policy", "critic"):
            want, got = run["steps"][-1][model], run["resumed"][model]
            assert _close(got["loss"], want["loss"], 1e-6) and _close(got["grad_norm"], want["grad_norm"], 1e-6)
        for name, tensor in run["critic_after"].items():
            assert torch.allclose(run["resumed_critic"][name], tensor, rtol=0, atol=1e-6), name
    run = ranks[0][optimizer]
    for name, tensor in run["after"].items():
        assert torch.allclose(run["resumed_after"][name], tensor, rtol=0, atol=1e-6), name


def test_a_sharded_state_is_not_restored_into_an_unsharded_optimizer(ranks: list[dict[str, Any]]) -> None:
    assert [seen["plain_restores_sharded"] for seen in ranks] == [False, False]


def test_the_context_builds_the_specs_expert_parallel_engine(ranks: list[dict[str, Any]],
                                                            model_dirs: dict[str, str]) -> None:
    """expertParallel 2 over two data-parallel ranks: experts {0,1} and {2,3} (each numbered 0, 1
    locally), the distributed optimizer by default, and the step of one rank holding all four."""
    one = dist_worker.single_rank_script(model_dirs["mixtral"])
    for seen in (r["experts"] for r in ranks):
        assert (seen["ep"], seen["dp"], seen["sharded"]) == (2, 2, True)
        assert seen["local_experts"] == ["0", "1"]
        assert _close(seen["train"]["loss"], one["train"]["loss"], 1e-5)
        assert _close(seen["train"]["grad_norm"], one["train"]["grad_norm"], 1e-4)
    after = ranks[0]["experts"]["export_after"]
    assert sorted(after) == sorted(one["export_after"])
    for name, tensor in one["export_after"].items():
        dist_worker.assert_same_after_adam(after[name], tensor, name, steps=1, noisy=0.01)


@pytest.mark.parametrize(("family", "ep", "experts"), [("qwen2", 2, "no"), ("mixtral", 3, "4")])
def test_the_engine_refuses_an_expert_parallelism_the_model_cannot_take(
        model_dirs: dict[str, str], family: str, ep: int, experts: str) -> None:
    """Before any process group: megatron would give a dense model expert groups for nothing, and
    assert inside its MoE layer on 4 experts over 3 ranks."""
    from tandem.sidecars.trainer.engines.megatron_engine import EngineError, MegatronEngine

    with pytest.raises(EngineError, match=f"expert parallelism {ep} needs a mixture-of-experts model .* "
                                          f"this model has {experts} experts"):
        MegatronEngine.from_hf(model_dirs[family], expert_parallel=ep)
