"""Multi-turn trajectories: the tokens an environment wrote (tool results) were not chosen by the policy, so
the KL that `klPenalty: reward` subtracts, REINFORCE++'s discounted returns and whitening, PPO's GAE and
the distillation term count only the model's tokens (`Sample.completion_mask`). Checked on a hand-built
trajectory whose environment tokens carry a large KL: every figure equals the one of the same trajectory
with its environment tokens cut out, and the environment tokens get advantage 0.
"""

from __future__ import annotations

import math

import pytest

from tandem.sidecars.algorithms import GRPO, PPO, Sample
from tandem.sidecars.algorithms.algorithm_interface import last_model_token

# sample 0: the model's 2 tokens, a tool result of 3, the model's 2 again; sample 1: a plain reply of 3
MASK0 = [1, 1, 0, 0, 0, 1, 1]
OLD0 = [-0.5, -1.0, -4.0, -5.0, -6.0, -0.7, -0.2]
REF0 = [-0.6, -0.8, -0.1, -0.1, -0.1, -0.9, -0.3]  # the environment's tokens: KL (k1) of -3.9 .. -5.9
OLD1, REF1 = [-0.3, -0.4, -0.5], [-0.2, -0.6, -0.5]
REWARDS = [1.0, 0.0]


def trajectory(*, cut: bool = False, masked: bool = True) -> list[Sample]:
    """The two samples; `cut`: sample 0 without its environment tokens (what the model alone wrote)."""
    keep = [j for j, m in enumerate(MASK0) if m or not cut]
    s0 = Sample([1, 2], [10 + j for j in keep], group=0, reward=REWARDS[0], old_logprobs=[OLD0[j] for j in keep],
                ref_logprobs=[REF0[j] for j in keep], rollout_logprobs=[OLD0[j] for j in keep],
                completion_mask=None if cut or not masked else list(MASK0))
    s1 = Sample([1, 2], [20, 21, 22], group=0, reward=REWARDS[1], old_logprobs=OLD1, ref_logprobs=REF1,
                rollout_logprobs=OLD1)
    return [s0, s1]


def advantages(algo: GRPO | PPO, samples: list[Sample]) -> list[list[float]]:
    batch = algo.prepare(samples, token_budget=32)
    got = batch.unpack(batch.token_fields["advantages"])
    return [got[i].tolist() for i in range(len(samples))]


def model_part(values: list[float]) -> list[float]:
    return [v for v, m in zip(values, MASK0, strict=True) if m]


def test_the_kl_reward_penalty_counts_the_models_tokens_only() -> None:
    coef = 0.1
    algo = GRPO(kl_coef=coef, kl_penalty="reward", kl_estimator="k1", advantage="rloo")
    adv = advantages(algo, trajectory())
    # by hand: R' = R - coef x sum of k1 = old - ref over the model's tokens; rloo of two: A_0 = R'_0 - R'_1
    kl0 = sum(o - r for o, r, m in zip(OLD0, REF0, MASK0, strict=True) if m)
    kl1 = sum(o - r for o, r in zip(OLD1, REF1, strict=True))
    a0 = (REWARDS[0] - coef * kl0) - (REWARDS[1] - coef * kl1)
    assert adv[0] == pytest.approx([a0] * 7) and adv[1] == pytest.approx([-a0] * 3)
    assert adv[0][0] == pytest.approx(advantages(algo, trajectory(cut=True))[0][0])
    # the environment's tokens would have moved it by coef x 14.7: the data makes the fix visible
    everything = advantages(algo, trajectory(masked=False))
    assert abs(everything[0][0] - a0) > 1.0
    batch = algo.prepare(trajectory(), token_budget=32)
    assert batch.stats["kl_reward"] == pytest.approx((kl0 + kl1) / 7)  # a mean over the 7 model tokens


@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_reinforce_pp_returns_and_whitening_skip_the_environments_tokens(gamma: float) -> None:
    algo = GRPO(kl_coef=0.05, kl_penalty="reward", kl_estimator="k1", advantage="reinforce_pp", gamma=gamma)
    adv = advantages(algo, trajectory())
    cut = advantages(algo, trajectory(cut=True))
    assert model_part(adv[0]) == pytest.approx(cut[0], rel=1e-5) and adv[1] == pytest.approx(cut[1], rel=1e-5)
    assert [a for a, m in zip(adv[0], MASK0, strict=True) if not m] == [0.0, 0.0, 0.0]
    # by hand, before whitening: sample 0's token returns over its 4 model tokens (the score on the last)
    r = [-0.05 * (o - f) for o, f, m in zip(OLD0, REF0, MASK0, strict=True) if m]
    r[-1] += REWARDS[0]
    returns0 = [sum(gamma ** (k - t) * r[k] for k in range(t, 4)) for t in range(4)]
    r1 = [-0.05 * (o - f) for o, f in zip(OLD1, REF1, strict=True)]
    returns1 = [sum(gamma ** (k - t) * r1[k] for k in range(t, 3)) for t in range(3)]
    every = returns0 + returns1
    mean = sum(every) / 7
    std = math.sqrt(sum((x - mean) ** 2 for x in every) / 7 + 1e-8)
    assert model_part(adv[0]) == pytest.approx([(x - mean) / std for x in returns0], rel=1e-4)
    assert model_part(adv[0]) != pytest.approx(model_part(advantages(algo, trajectory(masked=False))[0]), rel=1e-3)


def test_ppo_rewards_and_gae_over_the_models_tokens_only() -> None:
    algo = PPO(kl_coef=0.1, gamma=0.95, lam=0.9, whiten=True)
    rewards = algo.token_rewards(trajectory())
    assert [x for x, m in zip(rewards[0], MASK0, strict=True) if not m] == [0.0, 0.0, 0.0]
    assert rewards[0][-1] == pytest.approx(-0.1 * (OLD0[-1] - REF0[-1]) + REWARDS[0])
    adv = advantages(algo, trajectory())
    cut = advantages(algo, trajectory(cut=True))
    assert model_part(adv[0]) == pytest.approx(cut[0], rel=1e-5) and adv[1] == pytest.approx(cut[1], rel=1e-5)
    assert [a for a, m in zip(adv[0], MASK0, strict=True) if not m] == [0.0, 0.0, 0.0]


def test_a_trajectory_ending_in_the_environments_tokens_is_scored_on_the_models_last() -> None:
    assert last_model_token([1, 1, 0, 0]) == 1 and last_model_token([1.0, 0.0, 1.0]) == 2
    assert last_model_token([1, 1, 1]) == 2
    s = Sample([1], [5, 6, 7, 8], group=0, reward=2.0, completion_mask=[1, 1, 0, 0])
    assert PPO(kl_coef=0.0).token_rewards([s])[0] == [0.0, 2.0, 0.0, 0.0]


def test_distillation_counts_the_models_tokens_only() -> None:
    samples = trajectory()
    for s in samples:
        s.teacher_logprobs = [x - 0.5 for x in (s.ref_logprobs or [])]
    samples[0].teacher_logprobs = [x - (0.5 if m else 9.0) for x, m in zip(OLD0, MASK0, strict=True)]
    samples[1].teacher_logprobs = [x - 0.5 for x in OLD1]
    algo = GRPO(kl_coef=0.0, distill_coef=1.0)
    adv = advantages(algo, samples)
    assert [a for a, m in zip(adv[0], MASK0, strict=True) if not m] == pytest.approx([adv[0][0] + 0.5] * 3)
    batch = algo.prepare(samples, token_budget=32)
    assert batch.stats["distill_reverse_kl"] == pytest.approx(0.5)  # not pulled up by the tool output's 9.0
