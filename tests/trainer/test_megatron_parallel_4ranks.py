"""MegatronEngine with four gloo ranks on CPU: layouts that combine, TP2xPP2 (Qwen2) and TP2xEP2 (Mixtral).

One spawn of four processes per module runs both layouts in turn (dist_worker.run, the script of the
two-rank tests); the test process compares what they saw with the HF tensors and with a single-rank
engine: the export, logits and one training step, the RL path's scored positions on rows of odd
length, the rollout's TP=2 slices, which layers, experts and batch rows each rank holds, and (TP2xEP2)
routing replay: each rank's routers use exactly its sequence part of the given routing in every layer.
TP2xPP2 is one model copy cut four ways (data-parallel size 1); TP2xEP2 is two data-parallel copies
of the dense layers whose experts are split over the two, run with sequence parallelism (megatron
trains MoE layers under tensor parallelism only so).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dist_worker
import pytest
import torch
from safetensors.torch import load_file
from tiny_models import make_tiny_hf_model

from tandem.checkpoint_engine import convert

pytestmark = pytest.mark.megatron
WORLD = 4
Layout = tuple[str, int, int, int]  # family, tp, pp, ep
LAYOUTS: list[Layout] = [("qwen2", 2, 2, 1), ("mixtral", 2, 1, 2)]
IDS = ["tp2pp2", "tp2ep2"]
Ranks = dict[Layout, list[dict[str, Any]]]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny-hf")
    return {f: Path(make_tiny_hf_model(root / f, family=f)) for f in ("qwen2", "mixtral")}


@pytest.fixture(scope="module")
def ranks(model_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Ranks:
    return dist_worker.spawn_layouts(model_dirs, LAYOUTS, WORLD, tmp_path_factory.mktemp("ranks"), scored=True,
                                     replay=True)


@pytest.fixture(scope="module")
def single(model_dirs: dict[str, Path]) -> dict[str, dict[str, Any]]:
    """What one rank (TP=PP=EP=1) sees for the same script, per family."""
    return {family: dist_worker.single_rank_script(d, scored=True) for family, d in model_dirs.items()}


@pytest.mark.parametrize("layout", LAYOUTS, ids=IDS)
def test_export_equals_hf_and_only_rank0_exports(layout: Layout, ranks: Ranks, model_dirs: dict[str, Path]) -> None:
    dist_worker.assert_export_is_hf(ranks[layout], load_file(str(model_dirs[layout[0]] / "model.safetensors")))


@pytest.mark.parametrize("layout", LAYOUTS, ids=IDS)
def test_forward_and_train_step_match_single_rank(
    layout: Layout, ranks: Ranks, single: dict[str, dict[str, Any]]
) -> None:
    dist_worker.assert_matches_single_rank(ranks[layout], single[layout[0]])


@pytest.mark.parametrize("layout", LAYOUTS, ids=IDS)
def test_scored_positions_of_odd_length_rows_match_single_rank(
    layout: Layout, ranks: Ranks, single: dict[str, dict[str, Any]]
) -> None:
    """The RL path: log-probs and a train step on the loss_mask's positions only (the chunked output
    head), rows of 11 tokens. Under TP2xEP2 megatron runs MoE with sequence parallelism, so each
    micro-batch is padded to 12 columns and the scored positions are gathered across the TP ranks."""
    one = single[layout[0]]["scored"]
    assert torch.count_nonzero(one["scored"]) == int(dist_worker.scored_batch()["loss_mask"].sum()) == 13
    for seen in (rank["scored"] for rank in ranks[layout]):
        assert seen["all"].shape == seen["scored"].shape == (2, 11)
        assert (seen["all"] - one["all"]).abs().max().item() < 1e-5
        assert (seen["scored"] - one["scored"]).abs().max().item() < 1e-5
        assert abs(seen["train"]["loss"] - one["train"]["loss"]) < 1e-5
        assert abs(seen["train"]["grad_norm"] - one["train"]["grad_norm"]) < 1e-4


@pytest.mark.parametrize("layout", LAYOUTS, ids=IDS)
def test_rollout_tp2_slices(layout: Layout, ranks: Ranks, model_dirs: dict[str, Path]) -> None:
    """Rank 0 hands each rollout TP rank the HF tensors cut as the converter cuts the checkpoint itself
    (experts included), and for Qwen2 in vLLM's layout; the other ranks hand out nothing."""
    model_dir = model_dirs[layout[0]]
    full = load_file(str(model_dir / "model.safetensors"))
    shape = convert.ModelShape.from_hf_dir(model_dir)
    rank0, *others = ranks[layout]
    for r in range(2):
        part = rank0[f"slice{r}"]
        want = dict(convert.slice_for_rollout(shape, iter(full.items()), 2, r))
        assert sorted(part) == sorted(want)
        for name, tensor in want.items():
            assert torch.equal(part[name], tensor), name
        if layout[0] == "qwen2":
            dist_worker.assert_vllm_tp2_slice(part, full, r)
    assert all(seen["slice0"] == {} and seen["slice1"] == {} for seen in others)


def test_tp2pp2_ranks_hold_one_layer_of_one_stage_and_the_whole_batch(ranks: Ranks) -> None:
    """Ranks 0-1 are the first stage (embedding), 2-3 the last (tied output copy); one layer each."""
    seen = ranks[LAYOUTS[0]]
    for r, rank in enumerate(seen):
        names = rank["local_names"]
        assert ("embedding.word_embeddings.weight" in names) == (r < 2), r
        assert ("output_layer.weight" in names) == (r >= 2), r
        assert {n.split(".")[2] for n in names if n.startswith("decoder.layers.")} == {"0"}, r
        assert rank["train_rows"] == 2  # data-parallel size 1: every rank sees the batch's two rows


def test_tp2ep2_ranks_hold_half_the_experts_and_half_the_batch(ranks: Ranks) -> None:
    """Four experts, two per expert-parallel rank (numbered 0 and 1 locally); two data-parallel copies
    of the dense layers, each training on one of the batch's two rows."""
    seen = ranks[LAYOUTS[1]]
    for rank in seen:
        assert {n.split(".")[6] for n in rank["local_names"] if ".local_experts." in n} == {"0", "1"}
        assert rank["train_rows"] == 1
    assert {n.split(".")[5] for n in seen[0]["export"] if ".experts." in n} == {"0", "1", "2", "3"}


def test_tp2ep2_each_rank_replays_its_part_of_the_routing(ranks: Ranks) -> None:
    """Sequence parallelism: each TP rank routes its 6 of the 12 (padded) positions of both rows; the EP ranks
    (two data-parallel copies) route alike. The routers' maps equal the given routing, every layer."""
    from tandem.sidecars.trainer.engines.routing_replay import targets

    routed = dist_worker.replay_batch()["routed_experts"]
    seen_all = [rank["replay"] for rank in ranks[("mixtral", 2, 1, 2)]]
    assert sorted((s["tp_rank"], s["ep_rank"]) for s in seen_all) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for seen in seen_all:
        want = targets(routed, 12, 2, seen["tp_rank"], True)  # [6 positions x 2 rows, layers, topk]
        assert sorted(seen["maps"]) == [0, 1]
        for layer, got in seen["maps"].items():
            expected = torch.zeros(want.shape[0], 4, dtype=torch.bool).scatter_(1, want[:, layer], True)
            assert torch.equal(got, expected), (seen["tp_rank"], seen["ep_rank"], layer)


def test_tp2ep2_replayed_logprobs_and_train_step_match_single_rank(ranks: Ranks, model_dirs: dict[str, Path]) -> None:
    one = dist_worker.replay_script(model_dirs["mixtral"])
    assert (one["replayed"] - one["plain"]).abs().max() > 1e-3, "the random routing changes the log-probs"
    for seen in (rank["replay"] for rank in ranks[("mixtral", 2, 1, 2)]):
        assert (seen["replayed"] - one["replayed"]).abs().max().item() < 1e-5
        assert (seen["plain"] - one["plain"]).abs().max().item() < 1e-5
        assert abs(seen["train"]["loss"] - one["train"]["loss"]) < 1e-5
        assert abs(seen["train"]["grad_norm"] - one["train"]["grad_norm"]) < 1e-4
