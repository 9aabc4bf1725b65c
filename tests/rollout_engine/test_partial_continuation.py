"""Partial rollouts on the live vLLM engine: a completion cut at the token budget under one weight
version and continued under the next records each segment's version, and each segment's log-probs
are those of the weights that sampled it (checked against transformers on the same tokens).

Real vLLM (CPU), real etcd, real /dev/shm; the session's one engine (conftest.live_engine).
"""

from __future__ import annotations

from typing import Any

import pytest
import tiny_model
import torch

from tandem.sidecars.rollout_engine.engine import RolloutEngine
from tandem.sidecars.rollout_engine.sampling import Completion, SamplingOptions
from tandem.sidecars.trainer.loop.data.dataset import Prompt
from tandem.sidecars.trainer.loop.rollout.partial import PartialRollouts

pytestmark = [pytest.mark.vllm, pytest.mark.etcd]


def hf_logprobs(model: Any, context: list[int], tokens: list[int]) -> list[float]:
    """log p(tokens[j] | context + tokens[:j]) under `model`, as transformers computes it."""
    ids = torch.tensor([context + tokens])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
    return [float(logp[len(context) + j - 1, t]) for j, t in enumerate(tokens)]


def test_continued_across_a_version_change(live_engine: RolloutEngine, live_publisher: Any) -> None:
    first, second = tiny_model.random_model(seed=41), tiny_model.random_model(seed=42)
    v1 = live_publisher.publish(None, first.state_dict().items()).version
    live_engine.update(v1)

    def generate(inputs: list[str | list[int]], limits: list[int]) -> tuple[list[Completion], int]:
        opts = SamplingOptions(temperature=1.0, max_tokens=8, ignore_eos=True)  # lengths set by the budget
        out = live_engine.generate(inputs, opts, n=1, max_tokens=limits)
        assert live_engine.version is not None
        return [g[0] for g in out], live_engine.version

    partial = PartialRollouts(token_budget=5, max_tokens=8, max_age=3, group_size=2)
    got = partial.step(generate, [Prompt("alpha beta gamma", "x", index=7)], v1, until_finished=False)
    assert got.finished == [] and partial.inflight() == [7]
    assert [len(m.token_ids) for m in partial.carried[0].members] == [5, 5]

    v2 = live_publisher.publish(None, second.state_dict().items()).version
    live_engine.update(v2)
    got = partial.step(generate, [], v2)
    assert partial.carried == [] and len(got.finished) == 1
    for m in got.finished[0].members:
        assert [(s.version, s.tokens) for s in m.segments] == [(v1, 5), (v2, 3)]
        assert m.versions() == [v1] * 5 + [v2] * 3 and len(m.token_ids) == len(m.logprobs) == 8
        head, tail = m.token_ids[:5], m.token_ids[5:]
        # each segment's behaviour log-probs are those of the version that sampled it, in full context
        assert m.logprobs[:5] == pytest.approx(hf_logprobs(first, m.prompt_ids, head), abs=2e-3)
        assert m.logprobs[5:] == pytest.approx(hf_logprobs(second, m.prompt_ids + head, tail), abs=2e-3)
        stale = hf_logprobs(first, m.prompt_ids + head, tail)  # the old weights would score them otherwise
        assert max(abs(a - b) for a, b in zip(stale, m.logprobs[5:], strict=True)) > 0.05


def test_per_prompt_token_limits_and_a_bad_list(live_engine: RolloutEngine) -> None:
    from tandem.checkpoint_engine import errors

    opts = SamplingOptions(temperature=1.0, max_tokens=9, ignore_eos=True)
    out = live_engine.generate(["alpha", "beta", [5, 6]], opts, n=1, max_tokens=[2, 7, 4])
    assert [len(g[0].token_ids) for g in out] == [2, 7, 4]
    with pytest.raises(errors.BadRequest, match="3 prompts"):
        live_engine.generate(["alpha", "beta", "gamma"], opts, max_tokens=[2, 3])
