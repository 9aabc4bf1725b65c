"""Per-sample fused attention (`segment_attention`) against Megatron's dense-mask attention, on real
megatron-core (CPU, one rank): packed rows (several samples and padding per row) and rows holding each
group's prompt once (shared prompts) give the same log-probs, and a GRPO train step the same loss and
gradients, for a tied GQA model (qwen2) and an untied one (llama). The dense path is itself compared
with transformers in test_megatron_engine.py and test_shared_prompts_engine.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_models import make_family_dirs

from tandem.sidecars.algorithms.algorithm_interface import Sample, row_budget
from tandem.sidecars.algorithms.grpo import GRPO
from tandem.sidecars.trainer.engines import micro_batches
from tandem.sidecars.trainer.engines.heads import shift_to_labels
from tandem.sidecars.trainer.engines.megatron_engine import MegatronEngine
from tandem.sidecars.trainer.engines.segment_attention import runs

pytestmark = pytest.mark.megatron
FAMILIES = ["qwen2", "llama"]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_family_dirs(tmp_path_factory.mktemp("tiny-hf-segments"), FAMILIES)


def groups(seed: int) -> list[Sample]:
    gen = torch.Generator().manual_seed(seed)
    out: list[Sample] = []
    for g, size in enumerate((3, 2, 4, 1)):
        prompt = torch.randint(1, 128, (int(torch.randint(3, 12, (1,), generator=gen)),), generator=gen).tolist()
        for k in range(size):
            n = int(torch.randint(1, 9, (1,), generator=gen))
            out.append(Sample(prompt, torch.randint(1, 128, (n,), generator=gen).tolist(), group=g,
                              reward=float((g + k) % 3), rollout_logprobs=[-1.0] * n))
    return out


def grads(engine: MegatronEngine) -> dict[str, torch.Tensor]:
    return {n: p.main_grad.detach().clone() for n, p in engine.named_parameters()}


def test_runs_and_the_layout() -> None:
    assert runs(torch.tensor([1, 1, 2, 2, 2, 0, 0])) == [(1, 0, 2), (2, 2, 5), (0, 5, 7)]
    seg = torch.tensor([[1, 1, 2, 0]])
    assert micro_batches.attention_input(seg, None, dense_max=4).dtype == torch.bool  # short: the dense mask
    layout = micro_batches.attention_input(seg, torch.tensor([[0, 0, 1, 0]]), dense_max=3)
    assert layout.tolist() == [[[1, 1, 2, 0], [0, 0, 1, 0]]]


@pytest.mark.parametrize("share", [False, True], ids=["packed", "shared-prompts"])
@pytest.mark.parametrize("family", FAMILIES)
def test_segments_equal_the_dense_mask(family: str, share: bool, model_dirs: dict[str, Path]) -> None:
    samples = groups(3)
    algo = GRPO(kl_coef=0.0, tis_cap=2.0, share_prompts=share)
    batch = algo.prepare(samples, row_budget(samples, share_prompts=share))
    assert batch.num_rows >= 2 and (batch.prefix_ids is not None) == share
    assert bool((batch.segment_ids == 0).any())  # padding in some row
    assert max(len(runs(row)) for row in batch.segment_ids) >= 3  # several samples share a row

    def loss_fn(out: torch.Tensor, mb: Any) -> tuple[torch.Tensor, dict[str, float]]:
        return algo.loss(shift_to_labels(out), mb)

    results = []
    for dense_max in (1 << 20, 0):  # every row through the dense mask, then every row per sample
        engine = MegatronEngine.from_hf(model_dirs[family], lr=1e-2, seed=0)
        engine.dense_max_tokens = dense_max
        logp = engine.token_logprobs(batch)
        metrics = engine.train_step(batch, loss_fn, micro_batch_size=2, reduction="sum")
        results.append((logp, metrics, grads(engine)))
    (lp_dense, m_dense, g_dense), (lp_seg, m_seg, g_seg) = results
    on = batch.loss_mask > 0
    assert torch.allclose(lp_dense[:, :-1][on[:, 1:]], lp_seg[:, :-1][on[:, 1:]], atol=1e-5)
    assert m_dense["grad_norm"] > 0
    for key in ("loss", "grad_norm", "ratio_mean"):
        assert m_seg[key] == pytest.approx(m_dense[key], abs=1e-5), key
    for name, g in g_dense.items():
        assert torch.allclose(g, g_seg[name], atol=1e-6), name


def test_activation_checkpointing_gives_the_same_step(model_dirs: dict[str, Path]) -> None:
    """trainer.activationCheckpointing (Megatron's full recompute) on rows that attend per sample: the
    loss and every gradient of the step without it."""
    samples = groups(5)
    algo = GRPO(kl_coef=0.0, share_prompts=True)
    batch = algo.prepare(samples, row_budget(samples, share_prompts=True))

    def loss_fn(out: torch.Tensor, mb: Any) -> tuple[torch.Tensor, dict[str, float]]:
        return algo.loss(shift_to_labels(out), mb)

    results = []
    for recompute in (False, True):
        engine = MegatronEngine.from_hf(model_dirs["qwen2"], lr=1e-2, seed=0, recompute=recompute)
        engine.dense_max_tokens = 0
        assert bool(engine.config.recompute_granularity) == recompute
        results.append((engine.train_step(batch, loss_fn, micro_batch_size=2, reduction="sum"), grads(engine)))
    (m_off, g_off), (m_on, g_on) = results
    assert m_on["loss"] == pytest.approx(m_off["loss"], abs=1e-6) and m_off["grad_norm"] > 0
    for name, g in g_off.items():
        assert torch.allclose(g, g_on[name], atol=1e-6), name
