"""The trainer's memory does not grow across iterations, and each phase's peak is measured.

Real megatron-core on CPU, the driver's phases as it runs them (inference forwards on the completions,
a GRPO train step over micro-batches, the HF export that publish consumes), measured by the driver's
own `PhaseTimer(PhaseMemory())`. Every iteration packs a batch of another shape (completion lengths
drawn anew, as rollouts give). The bound is a ratio within one run: the peak of the last iteration over
the peak of the second (the first after the optimizer's state exists), and the same for the resident
memory between iterations; anything an iteration keeps (a graph, a cached batch, an export) fails it.
glibc's own retention, which made the SmolLM2 demo's trainer climb 2.8 -> 8.4 GB over four iterations
before `memory.release`, needs that model's sizes to show (tensors of a 12M-parameter model mostly
come from mmap and go back anyway): bench/memory.py measures it there, on the demo's job.
"""

from __future__ import annotations

import random
from functools import partial
from pathlib import Path

import pytest
from tiny_models import make_tiny_hf_model

from tandem.sidecars.algorithms.algorithm_interface import Sample, pack_samples, row_budget
from tandem.sidecars.algorithms.grpo import GRPO
from tandem.sidecars.trainer.engines.heads import shift_to_labels
from tandem.sidecars.trainer.engines.megatron_engine import MegatronEngine
from tandem.sidecars.trainer.loop.forwards import sharded
from tandem.sidecars.trainer.observe import memory
from tandem.sidecars.trainer.observe.timing import PhaseTimer

pytestmark = pytest.mark.megatron
ITERATIONS = 5
GROWTH = 1.05  # the last iteration's peak may exceed the second's by 5% at most


def _samples(rng: random.Random, vocab: int) -> list[Sample]:
    out = []
    for group in range(8):
        prompt = [rng.randrange(1, vocab) for _ in range(rng.randrange(12, 40))]
        for _ in range(4):
            completion = [rng.randrange(1, vocab) for _ in range(rng.randrange(4, 64))]
            out.append(Sample(prompt_ids=prompt, completion_ids=completion, group=group, reward=float(rng.random())))
    return out


@pytest.mark.skipif(not memory.reset_peak(), reason="/proc/self/clear_refs refused: the peak RSS cannot be reset")
def test_trainer_memory_is_flat_across_iterations(tmp_path: Path) -> None:
    vocab = 8192
    model = make_tiny_hf_model(tmp_path / "m", family="llama", hidden=192, layers=3, vocab=vocab, heads=4, kv_heads=2)
    engine = MegatronEngine.from_hf(model, lr=1e-4, seed=0, micro_batch_size=4)
    algo = GRPO(kl_coef=0.0, share_prompts=True)
    rng = random.Random(0)
    summaries = []
    for _ in range(ITERATIONS):
        timer = PhaseTimer(memory.PhaseMemory(releasing=memory.FREEING))  # the driver's meter
        samples = _samples(rng, vocab)
        budget = row_budget(samples, share_prompts=True, hidden=engine.shape.hidden)
        with timer("inference"):
            packed = pack_samples(samples, budget, share_prompts=True)
            old = sharded.per_sample_outputs([partial(engine.token_logprobs, scored_only=True)], packed, engine.par)
            for i, s in enumerate(samples):
                s.old_logprobs = old[0][i]
        with timer("train"):
            batch = algo.prepare(samples, budget)
            metrics = engine.train_step(batch, lambda out, mb: algo.loss(shift_to_labels(out), mb), reduction="sum")
        with timer("publish"):
            exported = {name: t.clone() for name, t in engine.export_hf()}
            del exported
        assert metrics["update_ok"] == 1.0
        assert timer.memory is not None
        summaries.append(timer.memory.summary())
    for s in summaries:
        assert set(s["phases"]) == {"inference", "train", "publish"}
        assert all(row["peak_rss_mib"] >= row["rss_mib"] * 0.5 > 0 for row in s["phases"].values())
    peaks = [s["peak_rss_mib"] for s in summaries]
    after = [s["phases"]["publish"]["rss_mib"] for s in summaries]
    assert peaks[-1] <= GROWTH * peaks[1], peaks
    assert max(after[2:]) <= GROWTH * after[1], after
    # the train step is the phase that peaks (activations), above what stays resident between phases
    assert all(s["phases"]["train"]["peak_rss_mib"] > s["phases"]["publish"]["rss_mib"] for s in summaries)
