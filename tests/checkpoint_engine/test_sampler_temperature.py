"""The rollout reports the log-probs of the distribution it sampled from: at temperature T, vLLM's log-prob of
each sampled token is log softmax(logits / T) of the model (its processed log-probs), not the raw model's.

The trainer engines score the same tempered distribution (tests/trainer/test_temperature.py), so the ratio and
the rollout/trainer mismatch compare like with like at any temperature. Real vLLM (the session's live engine)
against transformers' own logits of a version published to it.
"""

from __future__ import annotations

from typing import Any

import pytest
import tiny_model
import torch

from tandem.sidecars.rollout_engine.engine import RolloutEngine
from tandem.sidecars.rollout_engine.sampling import SamplingOptions

pytestmark = [pytest.mark.vllm, pytest.mark.etcd]

PROMPTS = [[5, 17, 33, 2, 9], [40, 41, 42], [7] * 6]
T = 0.5


def test_sampled_logprobs_are_those_of_the_tempered_policy(live_engine: RolloutEngine, live_publisher: Any) -> None:
    model = tiny_model.random_model(seed=21).eval()
    live_publisher.publish(None, model.state_dict().items())
    live_engine.update()
    out = live_engine.generate(PROMPTS, SamplingOptions(temperature=T, max_tokens=8, ignore_eos=True))
    tempered_gap, raw_gap = 0.0, 0.0
    for prompt, completions in zip(PROMPTS, out, strict=True):
        c = completions[0]
        ids = torch.tensor([prompt + list(c.token_ids)])
        with torch.no_grad():
            logits = model(ids).logits[0, len(prompt) - 1:-1].double()
        picked = torch.tensor(list(c.token_ids)).unsqueeze(1)
        tempered = torch.log_softmax(logits / T, dim=-1).gather(1, picked).squeeze(1)
        raw = torch.log_softmax(logits, dim=-1).gather(1, picked).squeeze(1)
        got = torch.tensor(c.logprobs, dtype=torch.float64)
        tempered_gap = max(tempered_gap, float((got - tempered).abs().max()))
        raw_gap = max(raw_gap, float((got - raw).abs().max()))
    assert tempered_gap < 1e-3, tempered_gap  # vLLM's kernels against transformers, float32 on CPU
    assert raw_gap > 0.05, raw_gap  # the raw model's log-probs are another distribution at T = 0.5
