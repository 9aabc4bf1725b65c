"""Hand-computed checks of the RL maths in tandem.sidecars.algorithms.functional."""

from __future__ import annotations

import math

import pytest
import torch

from tandem.sidecars.algorithms import functional as F


def test_group_advantages_scaled_and_unscaled() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 5.0])
    groups = [0, 0, 0, 0, 1, 1, 2]
    adv = F.group_advantages(rewards, groups)
    # group 0: mean 0.5, unbiased std sqrt(1/3); group 1 tied; group 2 alone
    s = math.sqrt(1 / 3)
    assert adv.tolist() == pytest.approx([0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s, 0, 0, 0], abs=1e-5)
    raw = F.group_advantages(rewards, groups, scale=False)
    assert raw.tolist() == pytest.approx([0.5, -0.5, -0.5, 0.5, 0, 0, 0])


@pytest.mark.parametrize(
    ("ratio", "adv", "loss", "clipped"),
    [
        (1.1, 1.0, -1.1, 0.0),  # inside the range
        (1.5, 1.0, -1.2, 1.0),  # above 1+eps with A>0: clipped at 1.2
        (0.5, 1.0, -0.5, 0.0),  # below 1-eps with A>0: pessimistic unclipped term
        (0.5, -1.0, 0.8, 1.0),  # below 1-eps with A<0: clipped at 0.8
        (1.5, -1.0, 1.5, 0.0),  # above 1+eps with A<0: unclipped (pessimistic)
        (0.9, -2.0, 1.8, 0.0),  # inside, negative advantage
    ],
)
def test_clipped_policy_loss(ratio: float, adv: float, loss: float, clipped: float) -> None:
    old = torch.tensor([math.log(0.3)])
    new = old + math.log(ratio)
    got, r, c = F.clipped_policy_loss(new, old, torch.tensor([adv]), clip=0.2)
    assert got.item() == pytest.approx(loss, rel=1e-5)
    assert r.item() == pytest.approx(ratio, rel=1e-5)
    assert c.item() == clipped


def test_clip_higher_is_asymmetric() -> None:
    old = torch.zeros(1)
    got, _, _ = F.clipped_policy_loss(old + math.log(1.25), old, torch.ones(1), clip=0.2, clip_high=0.28)
    assert got.item() == pytest.approx(-1.25, rel=1e-5)


def test_policy_gradient_at_ratio_one_is_advantage_weighted() -> None:
    logp = torch.tensor([math.log(0.5)], requires_grad=True)
    loss, _, _ = F.clipped_policy_loss(logp, logp.detach(), torch.tensor([2.0]), clip=0.2)
    loss.sum().backward()
    assert logp.grad is not None and logp.grad.item() == pytest.approx(-2.0)


def test_kl_k3_value_and_zero_at_equal() -> None:
    got = F.kl_k3(torch.tensor([math.log(0.5), -1.0]), torch.tensor([math.log(0.25), -1.0]))
    # d = ln 0.5: exp(d) - d - 1 = 0.5 + 0.693147 - 1
    assert got.tolist() == pytest.approx([0.5 + math.log(2) - 1, 0.0], abs=1e-6)
    assert (F.kl_k3(torch.randn(100), torch.randn(100)) >= 0).all()


def test_gae_three_steps_by_hand() -> None:
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.6, 0.7]])
    adv, ret = F.gae(rewards, values, torch.ones(1, 3), gamma=0.9, lam=0.8)
    # d2 = 1 - .7 = .3; d1 = .9*.7 - .6 = .03; d0 = .9*.6 - .5 = .04; gamma*lam = .72
    a2 = 0.3
    a1 = 0.03 + 0.72 * a2
    a0 = 0.04 + 0.72 * a1
    assert adv.tolist()[0] == pytest.approx([a0, a1, a2], abs=1e-6)
    assert ret.tolist()[0] == pytest.approx([a0 + 0.5, a1 + 0.6, a2 + 0.7], abs=1e-6)


def test_gae_masked_tail_and_rows_independent() -> None:
    rewards = torch.tensor([[0.0, 1.0, 9.0], [0.0, 0.0, 1.0]])
    values = torch.zeros(2, 3)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    adv, ret = F.gae(rewards, values, mask, gamma=1.0, lam=1.0)
    assert adv.tolist() == [[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]
    assert ret[0, 2].item() == 0.0


def test_dpo_loss_known_logprobs() -> None:
    loss, margin = F.dpo_loss(torch.tensor([-1.0]), torch.tensor([-2.0]), torch.tensor([-1.5]),
                              torch.tensor([-1.5]), beta=0.5)
    assert margin.item() == pytest.approx(0.5)
    assert loss.item() == pytest.approx(math.log(1 + math.exp(-0.5)), rel=1e-6)


def test_clipped_value_loss() -> None:
    loss, clipped = F.clipped_value_loss(torch.tensor([1.0, 0.6]), torch.tensor([0.5, 0.5]),
                                         torch.tensor([0.0, 1.0]), clip=0.2)
    # 1st: err 1.0, clipped value 0.7 -> 0.49; max 1.0 -> 0.5.  2nd: err .16, clip .6 -> .16
    assert loss.tolist() == pytest.approx([0.5, 0.08])
    assert clipped.tolist() == [0.0, 0.0]
    loss2, clipped2 = F.clipped_value_loss(torch.tensor([0.0]), torch.tensor([0.5]), torch.tensor([0.0]), 0.2)
    assert loss2.item() == pytest.approx(0.5 * 0.3**2) and clipped2.item() == 1.0


def test_loss_weights_token_vs_sequence() -> None:
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0, 1.0]])
    seq = torch.tensor([[0, 0, 0, 1, 1]])
    tok = F.loss_weights(mask, seq, "token")
    assert tok.tolist()[0] == pytest.approx([0.25, 0.25, 0.25, 0, 0.25])
    sq = F.loss_weights(mask, seq, "sequence")
    assert sq.tolist()[0] == pytest.approx([1 / 6, 1 / 6, 1 / 6, 0, 0.5])


def test_masked_whiten() -> None:
    x = torch.tensor([1.0, 3.0, 100.0])
    w = F.masked_whiten(x, torch.tensor([1.0, 1.0, 0.0]))
    assert w.tolist() == pytest.approx([-1.0, 1.0, 0.0], abs=1e-4)
