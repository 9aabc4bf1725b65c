"""Advantage estimators, KL estimators and reward shaping: one formula each, pure torch.

Role: what `grpo.GRPO.prepare` (and `ppo.PPO` for the KL estimators) turn rewards and log-probs into,
free of any engine and checked against hand-computed cases in tests/algorithms/test_estimators.py.
Callers: `grpo`, `ppo` in this package.

Advantages (`algorithm.advantage`), per sample unless said otherwise:
- grpo: (r - mean of its group) / (std of its group + eps); `norm_std=False` leaves r - mean (Dr. GRPO);
- rloo: r - mean of the *other* samples of its group (leave-one-out baseline) = n/(n-1) (r - mean);
- reinforce_pp: per token, the gamma-discounted return of the token rewards (the score on the last
  token, minus the KL penalty on each when `klPenalty: reward`), whitened over every token of the batch;
- reinforce_pp_baseline: the same with the group's mean score subtracted from the score first.
KL estimators of KL(policy || reference) per token, d = log pi - log pi_ref:
- k1: d (unbiased, signed); k2: d^2 / 2; k3: exp(-d) + d - 1 (unbiased, >= 0, low variance).
Overlong shaping (DAPO): a completion of length L with the limit M and a buffer B gets
0 when L <= M - B, (M - B - L) / B x penalty inside the buffer, and -penalty beyond M.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch

from tandem.sidecars.algorithms import functional as F

Advantage = Literal["grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline"]
KLEstimator = Literal["k1", "k2", "k3"]
OUTCOME: tuple[str, ...] = ("grpo", "rloo")  # one advantage per sample (the rest are per token)


def outcome_advantages(kind: str, rewards: torch.Tensor, groups: Sequence[int], *, norm_std: bool = True,
                       eps: float = 1e-6) -> torch.Tensor:
    """One advantage per sample: grpo (group-normalised) or rloo (leave-one-out baseline)."""
    if kind == "grpo":
        return F.group_advantages(rewards, groups, scale=norm_std, eps=eps)
    if kind != "rloo":
        raise ValueError(f"{kind!r} is not an outcome advantage (grpo, rloo)")
    rewards = rewards.to(torch.float32)
    ids = torch.as_tensor(list(groups), dtype=torch.int64)
    out = torch.zeros_like(rewards)
    for g in torch.unique(ids).tolist():
        sel = ids == g
        n = int(sel.sum())
        if n > 1:
            out[sel] = (rewards[sel] - rewards[sel].mean()) * n / (n - 1)
    return out


def group_centred(rewards: torch.Tensor, groups: Sequence[int]) -> torch.Tensor:
    """Each score minus its group's mean (REINFORCE++'s group baseline)."""
    return F.group_advantages(rewards, groups, scale=False)


def discounted_returns(token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """Per-token returns sum_{k >= t} gamma^(k - t) r_k over `[B, T]` (masked steps skipped), 0 where masked."""
    out = torch.zeros_like(token_rewards, dtype=torch.float32)
    running = torch.zeros(token_rewards.shape[0], device=token_rewards.device)
    for t in reversed(range(token_rewards.shape[1])):
        m = mask[:, t]
        running = torch.where(m > 0, token_rewards[:, t] + gamma * running, running)
        out[:, t] = running * m
    return out


def reinforce_pp(token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """REINFORCE++ advantages: discounted returns, whitened over every unmasked token of the batch."""
    returns = discounted_returns(token_rewards, mask, gamma)
    return F.masked_whiten(returns, mask) if mask.sum() > 1 else returns


def kl(kind: str, logprobs: torch.Tensor, ref_logprobs: torch.Tensor, bound: float = 20.0) -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) by the named estimator."""
    if kind == "k3":
        return F.kl_k3(logprobs, ref_logprobs, bound)
    d = torch.clamp(logprobs - ref_logprobs, -bound, bound)
    if kind == "k1":
        return d
    if kind == "k2":
        return 0.5 * d * d
    raise ValueError(f"unknown KL estimator {kind!r} (k1, k2, k3)")


def overlong_penalty(length: int, max_tokens: int, buffer: int, penalty: float = 1.0) -> float:
    """DAPO's soft overlong punishment (<= 0) for a completion of `length` tokens."""
    if buffer <= 0 or length <= max_tokens - buffer:
        return 0.0
    if length > max_tokens:
        return -penalty
    return (max_tokens - buffer - length) / buffer * penalty
