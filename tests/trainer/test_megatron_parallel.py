"""MegatronEngine with two gloo ranks on CPU: TP=2 and PP=2 (Qwen2), EP=2 (Mixtral experts), DP=2.

One spawn of two processes runs the three layouts in turn (see dist_worker.py); the test process
compares what they saw with the HF tensors and with a single-rank engine: exports, rollout TP
slices, logits, a training step (TP, PP and EP), and global layer/expert numbers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dist_worker
import pytest
import torch
from safetensors.torch import load_file
from tiny_models import make_tiny_hf_model

from tandem.sidecars.trainer.engines.megatron_engine import MegatronEngine

pytestmark = pytest.mark.megatron
Layout = tuple[str, int, int, int]  # family, tp, pp, ep
LAYOUTS: list[Layout] = [("qwen2", 2, 1, 1), ("qwen2", 1, 2, 1), ("mixtral", 1, 1, 2), ("qwen2", 1, 1, 1)]
IDS = ["tp2", "pp2", "ep2", "dp2"]
Ranks = dict[Layout, list[dict[str, Any]]]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny-hf")
    return {f: Path(make_tiny_hf_model(root / f, family=f)) for f in ("qwen2", "mixtral")}


@pytest.fixture(scope="module")
def ranks(model_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Ranks:
    return dist_worker.spawn_layouts(model_dirs, LAYOUTS, 2, tmp_path_factory.mktemp("ranks"))


@pytest.fixture(scope="module")
def single(model_dirs: dict[str, Path]) -> dict[str, dict[str, Any]]:
    """What one rank (TP=PP=EP=1) sees for the same script, per family."""
    seen: dict[str, dict[str, Any]] = {}
    for family, model_dir in model_dirs.items():
        engine = MegatronEngine.from_hf(model_dir, lr=1e-2, seed=0)
        batch = dist_worker.fixed_batch()
        sharded = dist_worker.sharded_forward(engine) if family == "qwen2" else None
        logits = engine.logits(batch)
        train = engine.train_step(batch, dist_worker.nll_loss, micro_batch_size=1)
        seen[family] = {"logits": logits, "train": train, "export_after": dist_worker.copy_tensors(engine.export_hf()),
                        "sharded": sharded}
        if family == "qwen2":  # the data-parallel and critic scripts, on one rank
            seen[family]["dp"] = dist_worker.dp_script(engine)
            seen[family]["export_dp"] = dist_worker.copy_tensors(engine.export_hf())
            seen[family]["critic"] = dist_worker.critic_script(str(model_dir), 1)
    return seen


@pytest.mark.parametrize("layout", LAYOUTS, ids=IDS)
def test_export_equals_hf_and_only_rank0_exports(layout: Layout, ranks: Ranks, model_dirs: dict[str, Path]) -> None:
    dist_worker.assert_export_is_hf(ranks[layout], load_file(str(model_dirs[layout[0]] / "model.safetensors")))


@pytest.mark.parametrize("layout", LAYOUTS, ids=IDS)
def test_forward_and_train_step_match_single_rank(
    layout: Layout, ranks: Ranks, single: dict[str, dict[str, Any]]
) -> None:
    dist_worker.assert_matches_single_rank(ranks[layout], single[layout[0]])


def test_rollout_tp2_slices(ranks: Ranks, model_dirs: dict[str, Path]) -> None:
    """Slices follow vLLM's layout: q/k/v and gate/up by rows, o/down by columns, norms whole."""
    full = load_file(str(model_dirs["qwen2"] / "model.safetensors"))
    rank0, rank1 = ranks[LAYOUTS[0]]
    for r in range(2):
        dist_worker.assert_vllm_tp2_slice(rank0[f"slice{r}"], full, r)
    assert rank1["slice0"] == {} and rank1["slice1"] == {}


def test_pipeline_stages_use_global_layer_numbers(ranks: Ranks) -> None:
    first, last = ranks[LAYOUTS[1]]
    assert "embedding.word_embeddings.weight" in first["local_names"]
    assert "output_layer.weight" in last["local_names"]  # tied copy on the last stage
    # each stage numbers its one layer 0 locally; the export names them 0 and 1
    assert any(n.startswith("decoder.layers.0.") for n in last["local_names"])
    assert not any(n.startswith("decoder.layers.1.") for n in first["local_names"] + last["local_names"])
    assert "model.layers.1.self_attn.q_proj.weight" in first["export"]
    assert "lm_head.weight" not in first["export"]  # tied: HF keeps only embed_tokens


def test_expert_parallel_ranks_hold_half_the_experts_under_global_numbers(ranks: Ranks) -> None:
    rank0, rank1 = ranks[LAYOUTS[2]]
    for seen in (rank0, rank1):  # 4 experts, 2 per rank, numbered 0 and 1 locally
        local = {n.split(".")[6] for n in seen["local_names"] if ".local_experts." in n}
        assert local == {"0", "1"}
    experts = {n.split(".")[5] for n in rank0["export"] if ".experts." in n}
    assert experts == {"0", "1", "2", "3"}


def test_data_parallel_ranks_split_the_batch_and_match_one_rank(
    ranks: Ranks, single: dict[str, dict[str, Any]]
) -> None:
    """Each dp rank trains on its own rows, yet the steps equal one rank's over the whole batch."""
    rank0, rank1 = ranks[LAYOUTS[3]]
    one = single["qwen2"]
    assert (rank0["train_rows"], rank1["train_rows"]) == (1, 1)  # the fixed batch's 2 rows, one each
    shares = [(a["rows"], b["rows"]) for a, b in zip(rank0["dp"], rank1["dp"], strict=True)]
    assert shares == [(1, 2), (0, 1), (2, 3)], shares  # 3, 1 and 5 rows: uneven, and an empty rank
    for step, (rows, reduction) in enumerate(dist_worker.DP_SCRIPT):
        want = one["dp"][step]["metrics"]
        for seen in (rank0, rank1):
            got = seen["dp"][step]["metrics"]
            assert abs(got["loss"] - want["loss"]) < 1e-4 * max(1.0, abs(want["loss"])), (rows, reduction)
            assert abs(got["tokens"] - want["tokens"]) < 1e-6, (rows, reduction)
            assert abs(got["grad_norm"] - want["grad_norm"]) < 1e-3 * max(1.0, want["grad_norm"]), (rows, reduction)
    after = rank0["export_dp"]
    assert rank1["export_dp"] == {}
    for name, tensor in one["export_dp"].items():  # four Adam steps later, the same weights
        dist_worker.assert_same_after_adam(after[name], tensor, name, steps=4, noisy=0.02)


def test_critic_at_tp2_matches_one_rank(ranks: Ranks, single: dict[str, dict[str, Any]]) -> None:
    """The value head (column 0 of the output layer, on TP rank 0) gives every rank the same values,
    and training it at TP=2 follows the single-rank critic."""
    one = single["qwen2"]["critic"]
    for seen in (r["critic"] for r in ranks[LAYOUTS[0]]):
        assert torch.count_nonzero(seen["values0"]) == 0
        assert seen["losses"][-1] < seen["losses"][0]
        for got, want in zip(seen["losses"], one["losses"], strict=True):
            assert abs(got - want) < 1e-3 * max(1.0, want)
        assert torch.allclose(seen["values"], one["values"], atol=2e-3)
        assert torch.count_nonzero(seen["values"]) > 0


def test_inference_forwards_split_over_dp_and_gather_every_sample(
    ranks: Ranks, single: dict[str, dict[str, Any]]
) -> None:
    """Each dp rank runs the forwards on its rows; every rank ends with every sample's log-probs."""
    one = single["qwen2"]["sharded"]
    assert one["rows"] == 5 and sorted(one["logprobs"]) == [0, 1, 2, 3, 4] and one["forward_rows"] == [5]
    assert [r["sharded"]["forward_rows"] for r in ranks[LAYOUTS[3]]] == [[2], [3]]  # each rank its share
    for seen in (r["sharded"] for r in ranks[LAYOUTS[3]]):
        assert seen["skipped"] == {}
        assert sorted(seen["logprobs"]) == [0, 1, 2, 3, 4]
        for i, want in one["logprobs"].items():
            assert len(seen["logprobs"][i]) == len(want) == 4 + i
            assert torch.allclose(torch.tensor(seen["logprobs"][i]), torch.tensor(want), atol=1e-5), i
