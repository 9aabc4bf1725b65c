"""Rollout correction through a real engine (Megatron, a tiny qwen2 on CPU): the metrics a train step reports,
averaged by the engine over micro-batches, give the whole batch's mismatch_kl, ESS and masked shares, the
ones computed here from the engine's own log-probs of the same batch, however the rows are split."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_models import make_family_dirs

from tandem.sidecars.algorithms import rollout_correction as RC
from tandem.sidecars.algorithms.algorithm_interface import Sample
from tandem.sidecars.algorithms.grpo import GRPO
from tandem.sidecars.trainer.engines.megatron_engine import MegatronEngine

KEYS = ("mismatch_kl", "mismatch_ess", "is_ess", "is_token_masked_frac", "is_seq_masked_frac")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_family_dirs(tmp_path_factory.mktemp("tiny-hf"), ["qwen2"])["qwen2"]


def labels_layout(logprobs: torch.Tensor) -> torch.Tensor:
    return torch.cat([logprobs[:, 1:], torch.zeros_like(logprobs[:, :1])], dim=1)


def test_the_engines_metrics_are_the_whole_batchs(model_dir: Path) -> None:
    gen = torch.Generator().manual_seed(7)
    samples = []
    for i, n in enumerate(torch.randint(2, 7, (8,), generator=gen).tolist()):
        # the rollout's log-probs: the trainer's own plus noise, so ratios spread around 1
        samples.append(Sample(prompt_ids=torch.randint(1, 128, (3,), generator=gen).tolist(),
                              completion_ids=torch.randint(1, 128, (n,), generator=gen).tolist(),
                              group=i // 2, reward=float(i % 3), rollout_logprobs=[0.0] * n))
    correction = RC.Correction(level="sequence", mode="mask", aggregate="product", low=0.8, high=1.25)
    algo = GRPO(kl_coef=0.0, correction=correction)
    probe = algo.prepare(samples, token_budget=12)
    engine = MegatronEngine.from_hf(model_dir, lr=1e-2, seed=0)
    own = probe.unpack(labels_layout(engine.token_logprobs(probe)))
    for i, s in enumerate(samples):  # rollout = trainer + N(0, 0.3): some sequences leave the band
        s.rollout_logprobs = (own[i] + 0.3 * torch.randn(own[i].shape, generator=gen)).tolist()
    batch = algo.prepare(samples, token_budget=12)
    assert batch.num_rows >= 3
    lp = labels_layout(engine.token_logprobs(batch))
    _, stats = RC.weights(lp, batch.token_fields["rollout_logprobs"], batch.loss_mask, batch.seq_index, correction)
    want = RC.summarize(stats)
    assert 0 < want["is_seq_masked_frac"] < 1 and want["mismatch_kl"] > 0.01

    def loss(logprobs: torch.Tensor, mb: Any) -> tuple[torch.Tensor, dict[str, float]]:
        return algo.loss(labels_layout(logprobs), mb)

    for micro in (1, batch.num_rows):
        fresh = MegatronEngine.from_hf(model_dir, lr=1e-2, seed=0)
        got = RC.summarize(fresh.train_step(batch, loss, micro_batch_size=micro, reduction="sum"))
        for key in KEYS:
            assert got[key] == pytest.approx(want[key], rel=1e-4, abs=1e-7), (micro, key)
