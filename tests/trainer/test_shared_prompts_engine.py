"""Shared prompts on real megatron-core (CPU, one rank): a group's prompt packed once per row gives
the log-probs of transformers on each whole sequence, and a GRPO train step with the loss, metrics
and gradients of the step on one copy per completion — for a tied (qwen2) and an untied (llama)
model. The packing layout itself is tested in tests/algorithms/test_shared_prompts.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_models import grouped_samples, make_family_dirs

from tandem.sidecars.algorithms.algorithm_interface import pack_samples, row_budget
from tandem.sidecars.algorithms.grpo import GRPO
from tandem.sidecars.trainer.engines.heads import shift_to_labels
from tandem.sidecars.trainer.engines.megatron_engine import MegatronEngine

pytestmark = pytest.mark.megatron
FAMILIES = ["qwen2", "llama"]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_family_dirs(tmp_path_factory.mktemp("tiny-hf-shared"), FAMILIES)


@pytest.mark.parametrize("family", FAMILIES)
def test_shared_rows_give_transformers_logprobs(family: str, model_dirs: dict[str, Path]) -> None:
    import transformers

    samples = grouped_samples(1)
    engine = MegatronEngine.from_hf(model_dirs[family], lr=1e-2, seed=0)
    batch = pack_samples(samples, row_budget(samples, share_prompts=True), share_prompts=True)
    assert batch.prefix_ids is not None and all(p.shared > 0 for p in batch.placements)
    got = batch.unpack(shift_to_labels(engine.token_logprobs(batch)))
    # the inference phase's forward: the completions' positions only, through the chunked head
    scored = batch.unpack(shift_to_labels(engine.token_logprobs(batch, scored_only=True)))
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dirs[family], dtype=torch.float32).eval()
    for i, s in enumerate(samples):
        seq = torch.tensor([s.prompt_ids + s.completion_ids])
        with torch.no_grad():
            logp = torch.log_softmax(hf(seq).logits[0], dim=-1)
        n_p = len(s.prompt_ids)
        want = logp[torch.arange(n_p - 1, seq.shape[1] - 1), seq[0, n_p:]]
        assert (got[i] - want).abs().max().item() < 1e-5, i
        assert (scored[i] - want).abs().max().item() < 1e-5, i


@pytest.mark.parametrize("family", FAMILIES)  # qwen2 is tied: the head's gradient reaches the embedding
def test_grpo_step_on_shared_rows_equals_the_step_on_whole_rows(family: str, model_dirs: dict[str, Path]) -> None:
    samples = grouped_samples(2)

    results = []
    for share in (False, True):
        algo = GRPO(kl_coef=0.0, tis_cap=2.0, share_prompts=share)
        batch = algo.prepare(samples, row_budget(samples, share_prompts=share))

        def grpo_loss(out: torch.Tensor, mb: Any, algo: GRPO = algo) -> tuple[torch.Tensor, dict[str, float]]:
            return algo.loss(shift_to_labels(out), mb)

        engine = MegatronEngine.from_hf(model_dirs[family], lr=1e-2, seed=0)
        metrics = engine.train_step(batch, grpo_loss, micro_batch_size=2, reduction="sum")
        grads = {n: p.main_grad.detach().clone() for n, p in engine.named_parameters()}
        results.append((batch, metrics, grads))
    (whole, m1, g1), (shared, m2, g2) = results
    assert int((shared.segment_ids > 0).sum()) < int((whole.segment_ids > 0).sum())  # fewer tokens computed
    assert m1["grad_norm"] > 0
    for key in ("loss", "grad_norm", "rc_gap", "ratio_mean"):
        assert abs(m1[key] - m2[key]) < 1e-5, key
    for name in g1:
        assert torch.allclose(g1[name], g2[name], atol=1e-6), name
