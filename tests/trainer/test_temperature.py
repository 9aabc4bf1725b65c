"""The trainer engines score the policy the rollouts sample from: with `temperature` T (rollout.temperature,
set by the loop's start), every log-prob is log softmax(logits / T), on the chunked head and on the whole
logits alike, for the hf engine and Megatron; and the gradient is that of the tempered log-prob.

transformers' own logits are the reference; vLLM reports the same tempered log-probs
(tests/rollout_engine/test_sampler_temperature.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from tiny_models import grouped_samples, make_tiny_hf_model

from tandem.sidecars.algorithms.algorithm_interface import pack_samples, row_budget
from tandem.sidecars.trainer.engines.heads import shift_to_labels
from tandem.sidecars.trainer.engines.hf_engine import HFEngine

T = 0.6


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_hf_model(tmp_path_factory.mktemp("temperature") / "llama", family="llama")


def _want(model_dir: Path, samples: list[Any], temperature: float) -> list[torch.Tensor]:
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = []
    for s in samples:
        ids = torch.tensor([s.prompt_ids + s.completion_ids])
        with torch.no_grad():
            logits = hf(ids).logits[0, len(s.prompt_ids) - 1:-1]
        out.append(torch.log_softmax(logits / temperature, dim=-1)[torch.arange(len(s.completion_ids)),
                                                                   torch.tensor(s.completion_ids)])
    return out


def _engine(kind: str, model_dir: Path) -> Any:
    if kind == "megatron":
        from tandem.sidecars.trainer.engines.megatron_engine import MegatronEngine

        return MegatronEngine.from_hf(model_dir, trainable=False)
    return HFEngine.from_hf(model_dir, trainable=False)


@pytest.mark.parametrize("kind", ["hf", pytest.param("megatron", marks=pytest.mark.megatron)])
def test_engine_logprobs_are_of_the_tempered_policy(kind: str, model_dir: Path) -> None:
    samples = grouped_samples(3)
    want, raw = _want(model_dir, samples, T), _want(model_dir, samples, 1.0)
    engine = _engine(kind, model_dir)
    assert engine.temperature == 1.0  # the default: the model's own distribution
    engine.temperature = T
    batch = pack_samples(samples, row_budget(samples))
    for chunked in (True, False):  # the chunked head, and whole logits
        if kind == "hf":
            engine.plain_head = chunked
        else:
            engine.chunked_head = chunked
        for scored in (True, False):
            got = batch.unpack(shift_to_labels(engine.token_logprobs(batch, micro_batch_size=2, scored_only=scored)))
            for i in range(len(samples)):
                assert (got[i] - want[i]).abs().max().item() < 1e-5, (chunked, scored, i)
                assert (got[i] - raw[i]).abs().max().item() > 1e-3 or len(samples[i].completion_ids) == 0


def test_train_step_gradient_is_of_the_tempered_logprob(model_dir: Path) -> None:
    """One SGD-free check: the loss -sum log p_T(y) through the engine equals transformers' at T, and its
    gradient norm too (the head's weight gets the 1/T of the chain rule)."""
    samples = grouped_samples(4)
    engine = HFEngine.from_hf(model_dir, lr=0.0, clip_grad=1e9)
    engine.temperature = T
    batch = pack_samples(samples, row_budget(samples))

    def loss(out: torch.Tensor, mb: Any) -> tuple[torch.Tensor, dict[str, float]]:
        lp = shift_to_labels(out)
        return -(lp * mb.loss_mask).sum(), {}

    got = engine.train_step(batch, loss, micro_batch_size=4, reduction="sum")
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    total = torch.zeros(())
    for s in samples:
        ids = torch.tensor([s.prompt_ids + s.completion_ids])
        logits = hf(ids).logits[0, len(s.prompt_ids) - 1:-1] / T
        total = total - torch.log_softmax(logits, dim=-1)[torch.arange(len(s.completion_ids)),
                                                          torch.tensor(s.completion_ids)].sum()
    total.backward()
    norm = torch.sqrt(sum((p.grad ** 2).sum() for p in hf.parameters() if p.grad is not None))
    assert got["loss"] == pytest.approx(float(total), rel=1e-5)
    assert got["grad_norm"] == pytest.approx(float(norm), rel=1e-4)
