"""MegatronEngine on real megatron-core (CPU, gloo, one rank) against transformers.

Covers: HF weights loaded into Megatron give the same logits; export round-trips to exactly the
HF tensors; packed log-probs equal one-by-one log-probs; training steps change the weights and
lower the loss; gradient accumulation; offload/onload is bit-exact; greedy decoding matches HF.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from dist_worker import fixed_batch, nll_loss
from safetensors.torch import load_file
from tiny_models import make_family_dirs

from tandem.sidecars.algorithms.algorithm_interface import Sample
from tandem.sidecars.algorithms.grpo import GRPO
from tandem.sidecars.algorithms.packing import pack
from tandem.sidecars.trainer.engines.megatron_engine import EngineError, MegatronEngine

pytestmark = pytest.mark.megatron
FAMILIES = ["qwen2", "llama"]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_family_dirs(tmp_path_factory.mktemp("tiny-hf"), FAMILIES)


@pytest.fixture(scope="module")
def hf_models(model_dirs: dict[str, Path]) -> dict[str, Any]:
    import transformers

    return {
        f: transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
        for f, d in model_dirs.items()
    }


@pytest.fixture(scope="module")
def engines(model_dirs: dict[str, Path]) -> Iterator[dict[str, MegatronEngine]]:
    """Engines that tests only read from (never trained)."""
    yield {f: MegatronEngine.from_hf(d, lr=1e-2, seed=0) for f, d in model_dirs.items()}


def _one_row(ids: list[int]) -> dict[str, torch.Tensor]:
    tensor = torch.tensor([ids])
    return {"input_ids": tensor, "segment_ids": torch.ones_like(tensor)}


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_match_transformers(
    family: str, engines: dict[str, MegatronEngine], hf_models: dict[str, Any]
) -> None:
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = hf_models[family](ids).logits
    got = engines[family].logits({"input_ids": ids, "segment_ids": torch.ones_like(ids)})
    assert got.shape == want.shape
    assert (got - want).abs().max().item() < 1e-5


@pytest.mark.parametrize("family", FAMILIES)
def test_export_round_trips_exactly(
    family: str, engines: dict[str, MegatronEngine], model_dirs: dict[str, Path]
) -> None:
    want = load_file(str(model_dirs[family] / "model.safetensors"))
    got = dict(engines[family].export_hf())
    assert sorted(got) == sorted(want)
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype, name
        assert torch.equal(got[name], tensor), name
    assert engines[family].last_export_seconds > 0


@pytest.mark.parametrize("family", FAMILIES)
def test_packed_logprobs_equal_one_by_one(
    family: str, engines: dict[str, MegatronEngine], hf_models: dict[str, Any]
) -> None:
    gen = torch.Generator().manual_seed(2)
    seqs = [torch.randint(0, 128, (n,), generator=gen).tolist() for n in (5, 11, 3, 8, 6)]
    batch = pack([s[:2] for s in seqs], [s[2:] for s in seqs], token_budget=16)
    assert batch.num_rows < len(seqs)  # several samples share a row
    packed = engines[family].token_logprobs(batch)
    for p in batch.placements:
        seq = seqs[p.sample]
        got = packed[p.row, p.start : p.start + p.length]
        alone = engines[family].token_logprobs(_one_row(seq))[0]
        with torch.no_grad():
            ref = torch.log_softmax(hf_models[family](torch.tensor([seq])).logits[0], dim=-1)
        want = ref[torch.arange(len(seq) - 1), torch.tensor(seq[1:])]  # position t scores token t
        assert got[0] == 0 and alone[0] == 0
        assert (got - alone).abs().max().item() < 1e-5
        assert (got[1:] - want).abs().max().item() < 1e-5
    assert packed[batch.segment_ids == 0].abs().sum() == 0  # padding


def test_greedy_generate_matches_transformers(
    engines: dict[str, MegatronEngine], hf_models: dict[str, Any]
) -> None:
    prompt = [3, 17, 42, 5]
    got = engines["qwen2"].greedy_generate(prompt, max_new_tokens=8)
    with torch.no_grad():
        out = hf_models["qwen2"].generate(
            torch.tensor([prompt]), max_new_tokens=8, do_sample=False, pad_token_id=0, eos_token_id=None
        )
    assert got == out[0, len(prompt) :].tolist()


def _grads(engine: MegatronEngine) -> dict[str, torch.Tensor]:
    """The accumulated gradients of the last step (Megatron DDP keeps them in ``main_grad``)."""
    return {n: p.main_grad.detach().clone() for n, p in engine.named_parameters()}


def test_train_steps_change_weights_and_lower_loss(model_dirs: dict[str, Path]) -> None:
    engine = MegatronEngine.from_hf(model_dirs["llama"], lr=1e-2, seed=0)
    before = {n: p.detach().clone() for n, p in engine.named_parameters()}
    batch = fixed_batch()
    losses = [engine.train_step(batch, nll_loss)["loss"] for _ in range(4)]
    assert losses[-1] < losses[0] - 0.5
    for name, param in engine.named_parameters():
        assert not torch.equal(param, before[name]), f"{name} did not change"
    exported = dict(engine.export_hf())
    original = load_file(str(model_dirs["llama"] / "model.safetensors"))
    assert not torch.equal(
        exported["model.layers.0.self_attn.q_proj.weight"], original["model.layers.0.self_attn.q_proj.weight"]
    )


def test_gradient_accumulation_equals_one_big_micro_batch(model_dirs: dict[str, Path]) -> None:
    row = fixed_batch()
    batch = {k: torch.cat([v[:1], v[:1]]) for k, v in row.items()}  # two identical rows
    results = []
    for micro in (1, 2):
        engine = MegatronEngine.from_hf(model_dirs["qwen2"], lr=1e-2, seed=0)
        metrics = engine.train_step(batch, nll_loss, micro_batch_size=micro)
        results.append((metrics, _grads(engine)))
    (m1, p1), (m2, p2) = results
    assert abs(m1["loss"] - m2["loss"]) < 1e-6 and abs(m1["grad_norm"] - m2["grad_norm"]) < 1e-5
    for name in p1:  # gradients, not Adam's sign-like first update, are what must agree
        assert torch.allclose(p1[name], p2[name], atol=1e-6), name


def test_grpo_packed_batch_sums_micro_batch_losses(model_dirs: dict[str, Path]) -> None:
    """With the algorithms' globally weighted losses, 3 micro-batches give the 1-batch step."""
    gen = torch.Generator().manual_seed(3)
    samples = [
        Sample(
            prompt_ids=torch.randint(1, 128, (3,), generator=gen).tolist(),
            completion_ids=torch.randint(1, 128, (int(n),), generator=gen).tolist(),
            group=i // 2,
            reward=float(i % 3),
        )
        for i, n in enumerate(torch.randint(2, 8, (6,), generator=gen))
    ]
    algo = GRPO(kl_coef=0.0)
    batch = algo.prepare(samples, token_budget=12)

    def grpo_loss(logprobs: torch.Tensor, mb: Any) -> tuple[torch.Tensor, dict[str, float]]:
        labels_layout = torch.cat([logprobs[:, 1:], torch.zeros_like(logprobs[:, :1])], dim=1)
        return algo.loss(labels_layout, mb)

    assert batch.num_rows >= 3
    results = []
    for micro in (1, batch.num_rows):
        engine = MegatronEngine.from_hf(model_dirs["qwen2"], lr=1e-2, seed=0)
        metrics = engine.train_step(batch, grpo_loss, micro_batch_size=micro, reduction="sum")
        results.append((metrics, _grads(engine)))
    (m1, p1), (m2, p2) = results
    assert m1["update_ok"] == 1.0 and m1["grad_norm"] > 0
    assert abs(m1["loss"] - m2["loss"]) < 1e-6 and abs(m1["grad_norm"] - m2["grad_norm"]) < 1e-5
    for name in p1:  # gradients, not Adam's sign-like first update, are what must agree
        assert torch.allclose(p1[name], p2[name], atol=1e-6), name


@pytest.mark.parametrize("family", FAMILIES)  # qwen2 tied (the head's gradient reaches the embedding), llama untied
def test_output_layer_on_scored_positions_only_gives_the_full_step(family: str, model_dirs: dict[str, Path]) -> None:
    """A train step that runs the output layer on the completion tokens only (the default for a
    batch with a loss_mask) has the loss, metrics and gradients of the step that runs it everywhere."""
    gen = torch.Generator().manual_seed(5)
    samples = [Sample(prompt_ids=torch.randint(1, 128, (int(p),), generator=gen).tolist(),
                      completion_ids=torch.randint(1, 128, (int(n),), generator=gen).tolist(),
                      group=i // 2, reward=float(i % 3), rollout_logprobs=[-1.0] * int(n))
               for i, (p, n) in enumerate(zip(torch.randint(2, 9, (6,), generator=gen),
                                              torch.randint(1, 6, (6,), generator=gen), strict=True))]
    algo = GRPO(kl_coef=0.0)
    batch = algo.prepare(samples, token_budget=16)
    assert float(batch.loss_mask.sum()) < batch.num_rows * batch.row_length / 2  # mostly prompt and padding

    def grpo_loss(logprobs: torch.Tensor, mb: Any) -> tuple[torch.Tensor, dict[str, float]]:
        return algo.loss(torch.cat([logprobs[:, 1:], torch.zeros_like(logprobs[:, :1])], dim=1), mb)

    results = []
    for sparse in (True, False):
        engine = MegatronEngine.from_hf(model_dirs[family], lr=1e-2, seed=0)
        engine.score_only_loss_positions = sparse
        metrics = engine.train_step(batch, grpo_loss, micro_batch_size=2, reduction="sum")
        results.append((metrics, _grads(engine)))
    (m1, g1), (m2, g2) = results
    assert m1["grad_norm"] > 0
    for key in ("loss", "grad_norm", "rc_gap", "ratio_mean"):
        assert abs(m1[key] - m2[key]) < 1e-5, key
    for name in g1:
        assert torch.allclose(g1[name], g2[name], atol=1e-6), name


def _snapshot(engine: MegatronEngine) -> list[torch.Tensor]:
    return [t.detach().clone() for t in engine._state_tensors()]


def test_offload_onload_is_bit_exact(model_dirs: dict[str, Path]) -> None:
    engine = MegatronEngine.from_hf(model_dirs["qwen2"], lr=1e-2, seed=0)
    twin = MegatronEngine.from_hf(model_dirs["qwen2"], lr=1e-2, seed=0)
    batch = fixed_batch()
    for e in (engine, twin):
        e.train_step(batch, nll_loss)  # creates Adam moments and gradients
    state = _snapshot(engine)
    assert len(state) > 3 * len(list(engine.named_parameters()))  # params, grads, master/moments
    timings = engine.offload()
    assert timings["offload_bytes"] >= sum(p.numel() * 4 * 3 for _, p in twin.named_parameters())
    assert all(p.untyped_storage().nbytes() == 0 for _, p in engine.named_parameters())
    with pytest.raises(RuntimeError):
        engine.offload()
    back = engine.onload()
    assert back["onload_bytes"] == timings["offload_bytes"] and back["onload_seconds"] >= 0
    for old, new in zip(state, engine._state_tensors(), strict=True):
        assert torch.equal(old, new)
    # the next step after a round trip is the step an engine that never offloaded takes
    assert engine.train_step(batch, nll_loss)["loss"] == twin.train_step(batch, nll_loss)["loss"]
    for (name, a), (_, b) in zip(engine.named_parameters(), twin.named_parameters(), strict=True):
        assert torch.equal(a, b), name
    # a second cycle reuses the host buffers: they must hold the new state, not the old one
    state = _snapshot(engine)
    engine.offload()
    engine.onload()
    for old, new in zip(state, engine._state_tensors(), strict=True):
        assert torch.equal(old, new)


def test_tensor_parallel_larger_than_world_is_refused(model_dirs: dict[str, Path]) -> None:
    with pytest.raises(EngineError, match="world size"):
        MegatronEngine.from_hf(model_dirs["qwen2"], tensor_parallel=2)


def test_forward_only_engine_for_the_reference_model(
    model_dirs: dict[str, Path], engines: dict[str, MegatronEngine]
) -> None:
    reference = MegatronEngine.from_hf(model_dirs["qwen2"], trainable=False)
    batch = fixed_batch()
    assert torch.equal(reference.token_logprobs(batch), engines["qwen2"].token_logprobs(batch))
    assert all(not p.requires_grad for _, p in reference.named_parameters())
    with pytest.raises(EngineError, match="trainable"):
        reference.train_step(batch, nll_loss)
    moved = reference.offload()
    assert moved["offload_bytes"] == sum(p.numel() * 4 for _, p in reference.named_parameters())
    reference.onload()
    assert torch.equal(reference.token_logprobs(batch), engines["qwen2"].token_logprobs(batch))


def test_save_hf_after_training_loads_in_transformers(model_dirs: dict[str, Path], tmp_path: Path) -> None:
    import transformers

    engine = MegatronEngine.from_hf(model_dirs["llama"], lr=1e-2, seed=0)
    engine.train_step(fixed_batch(), nll_loss)
    saved = engine.save_hf(tmp_path / "step1", config_dir=model_dirs["llama"])
    assert (saved / "config.json").exists()
    hf = transformers.AutoModelForCausalLM.from_pretrained(saved, dtype=torch.float32).eval()
    ids = fixed_batch()["input_ids"][:1]
    with torch.no_grad():
        want = hf(ids).logits
    got = engine.logits({"input_ids": ids, "segment_ids": torch.ones_like(ids)})
    assert (got - want).abs().max().item() < 1e-5


def test_critic_starts_at_zero_and_learns_per_token_targets(model_dirs: dict[str, Path]) -> None:
    """A value-head engine: the policy's transformer, a zeroed untied head, values in the log-prob layout."""
    critic = MegatronEngine.from_hf(model_dirs["qwen2"], lr=1e-2, seed=0, value_head=True)
    batch = fixed_batch()
    seg = batch["segment_ids"]
    scored = torch.zeros_like(seg, dtype=torch.bool)
    scored[:, 1:] = (seg[:, 1:] == seg[:, :-1]) & (seg[:, 1:] != 0)
    before = critic.token_logprobs(batch)
    assert before.shape == seg.shape and torch.count_nonzero(before) == 0  # fresh head: V = 0
    original = load_file(str(model_dirs["qwen2"] / "model.safetensors"))
    loaded = dict(critic.named_parameters())["decoder.layers.0.mlp.linear_fc2.weight"]
    assert torch.equal(loaded.detach(), original["model.layers.0.mlp.down_proj.weight"])  # trunk = the policy's
    target = torch.where(seg == 1, 1.0, -0.5)  # a different value per sample

    def mse(values: torch.Tensor, mb: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        s = mb["segment_ids"]
        mask = torch.zeros_like(values)
        mask[:, 1:] = ((s[:, 1:] == s[:, :-1]) & (s[:, 1:] != 0)).float()
        t = torch.where(s == 1, 1.0, -0.5)
        return ((values - t) ** 2 * mask).sum() / mask.sum(), {}

    losses = [critic.train_step(batch, mse)["loss"] for _ in range(25)]
    assert losses[-1] < 0.05 * losses[0], losses
    after = critic.token_logprobs(batch)
    assert torch.allclose(after[scored], target[scored], atol=0.25)
    assert torch.count_nonzero(after[~scored]) == 0  # first tokens and padding carry no value
