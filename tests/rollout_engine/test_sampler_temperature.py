"""The rollout samples from, and reports the log-probs of, the tempered policy: at temperature T, vLLM's log-prob of
each sampled token is log softmax(logits / T) of the model (its processed log-probs), not the raw model's, and
its draws are distributed as that softmax (a chi-square test of 4,000 one-token draws per temperature).

The trainer engines score the same tempered distribution (tests/trainer/test_temperature.py), so the ratio and
the rollout/trainer mismatch compare like with like at any temperature. Real vLLM (the session's live engine)
against transformers' own logits of a version published to it.
"""

from __future__ import annotations

import collections
import math
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


DRAWS = 4000
Z = 4.26  # one-sided normal quantile of p = 1e-5: a correct sampler fails this test once in 100,000 runs


def _chi_square(counts: collections.Counter[int], probs: torch.Tensor, draws: int) -> tuple[float, float]:
    """Pearson's statistic of `counts` against `probs` (tokens expected >= 5 times each, the rest pooled) and its
    critical value at p = 1e-5 (Wilson-Hilferty's approximation of the chi-square quantile)."""
    expected = probs.double() * draws
    big = [t for t in range(len(probs)) if float(expected[t]) >= 5.0]
    stat = sum((counts.get(t, 0) - float(expected[t])) ** 2 / float(expected[t]) for t in big)
    rest_expected = draws - sum(float(expected[t]) for t in big)
    rest = draws - sum(counts.get(t, 0) for t in big)
    if rest_expected >= 5.0:
        stat += (rest - rest_expected) ** 2 / rest_expected
        big.append(-1)
    df = len(big) - 1
    critical = df * (1 - 2 / (9 * df) + Z * math.sqrt(2 / (9 * df))) ** 3
    return stat, critical


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_draws_follow_the_tempered_softmax(live_engine: RolloutEngine, live_publisher: Any,
                                           temperature: float) -> None:
    """The sampler itself (vLLM-CPU's Gumbel-max kernel), not only the log-probs it reports: the frequency of each
    first token over DRAWS draws is that of softmax(logits / T), and clearly not that of another temperature."""
    model = tiny_model.random_model(seed=22).eval()
    live_publisher.publish(None, model.state_dict().items())
    live_engine.update()
    prompt = PROMPTS[0]
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0, -1].double()
    out = live_engine.generate([prompt], SamplingOptions(temperature=temperature, max_tokens=1, ignore_eos=True),
                               n=DRAWS)
    counts = collections.Counter(c.token_ids[0] for c in out[0])
    assert sum(counts.values()) == DRAWS
    stat, critical = _chi_square(counts, torch.softmax(logits / temperature, dim=-1), DRAWS)
    assert stat < critical, (temperature, stat, critical, counts.most_common(5))
    other = 2.0 if temperature == 1.0 else 1.0  # the statistic can tell a wrong temperature apart
    wrong, wrong_critical = _chi_square(counts, torch.softmax(logits / other, dim=-1), DRAWS)
    assert wrong > 3 * wrong_critical, (temperature, wrong, wrong_critical)
