"""Iterations carry the optimizer: three iterations of Tandem's real phases equal three AdamW steps of a plain
reference whose optimizer state persists, and differ from a reference that starts AdamW afresh each iteration.

tests/trainer/test_loop_reference.py checks one iteration across the job shapes; what an iteration leaves to the
next (Adam's moments and step count, the weights the next Inference phase scores) is checked here, on both
engines: one engine object through three `inference` + `train` calls, as the driver's loop makes them. A reset
optimizer (a step counter back at 1 makes every update lr * sign(gradient)) would pass the one-iteration test
and fail this one. The reference reuses test_loop_reference's plain pieces (model loading, log-probs, group
advantages), none of Tandem's code.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import test_loop_reference as ref
import torch
from tiny_models import make_tiny_hf_model

from tandem.sidecars.algorithms.algorithm_choice import make_algorithm
from tandem.sidecars.algorithms.algorithm_interface import Sample
from tandem.sidecars.trainer.loop.context import TrainerContext
from tandem.sidecars.trainer.loop.phases.inference import inference
from tandem.sidecars.trainer.loop.phases.train import train
from tandem.spec.models import RLHFJob

ITERATIONS = 3


def _engine(name: str, policy: Path) -> Any:
    if name == "megatron":
        from tandem.sidecars.trainer.engines.megatron_engine import MegatronEngine

        return MegatronEngine.from_hf(policy, lr=ref.LR, seed=0, micro_batch_size=4)
    from tandem.sidecars.trainer.engines.hf_engine import HFEngine

    return HFEngine.from_hf(policy, lr=ref.LR, seed=0, micro_batch_size=4)


def _reference(policy: Path, samples: list[Sample], iterations: int, fresh_optimizer: bool) -> dict[str, torch.Tensor]:
    """`iterations` GRPO iterations of one optimizer step each over the same samples (token-mean, clip 0.2; at one
    step the ratio is 1 and the clip never bites), AdamW kept or made afresh per iteration."""
    model = ref._load(policy)
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=ref.LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    adv = ref._group_advantages([s.reward for s in samples])
    tokens = sum(len(s.completion_ids) for s in samples)
    for _ in range(iterations):
        if fresh_optimizer:
            opt = torch.optim.AdamW(params, lr=ref.LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
        opt.zero_grad()
        total = torch.zeros(())
        for s, a in zip(samples, adv, strict=True):
            logp = ref._logprobs(model, s)
            total = total - (torch.exp(logp - logp.detach()) * a).sum() / tokens
        total.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("engine_name", ["hf", pytest.param("megatron", marks=pytest.mark.megatron)])
def test_iterations_carry_the_optimizer_state(engine_name: str, tmp_path: Path) -> None:
    policy = make_tiny_hf_model(tmp_path / "policy", seed=0)
    samples = ref._samples(policy)
    start = {n: p.detach().clone() for n, p in ref._load(policy).named_parameters()}
    job = RLHFJob.model_validate({"metadata": {"name": "iterations"}, "spec": {
        "model": {"path": str(policy)}, "dataset": {"path": "d.jsonl"}, "gpusPerPod": 0,
        "rewards": [{"type": "answerMatch"}], "algorithm": {**ref.GRPO, "lr": ref.LR, "groupSize": 4},
        "trainer": {"engine": engine_name, "globalBatchSize": 16, "microBatchSize": 4}}})
    engine = _engine(engine_name, policy)
    ctx = TrainerContext(env=None, job=job, engine=engine, reference=None,  # type: ignore[arg-type]
                         algorithm=make_algorithm(job.spec.algorithm), rewards=None,  # type: ignore[arg-type]
                         dataset=None, eos_id=0, pad_id=0)  # type: ignore[arg-type]
    gaps = []
    for it in range(1, ITERATIONS + 1):
        copies = [Sample(**vars(s)) for s in samples]
        inference(ctx, copies, [], scored=([s.reward for s in copies], {}))
        metrics = train(ctx, copies)
        assert metrics["optimizer_steps"] == 1
        got = {n: t.detach().clone() for n, t in engine.export_hf()}
        kept = _reference(policy, samples, it, fresh_optimizer=False)
        gap = ref._relative_gap(got, {n: t for n, t in kept.items() if n in got}, start)
        assert gap < 2e-3, (engine_name, it, gap)
        gaps.append(gap)
    fresh = _reference(policy, samples, ITERATIONS, fresh_optimizer=True)
    # a fresh AdamW per iteration is another update altogether (~0.3 here): the test can tell the two apart
    assert ref._relative_gap(got, {n: t for n, t in fresh.items() if n in got}, start) > 50 * max(gaps)
