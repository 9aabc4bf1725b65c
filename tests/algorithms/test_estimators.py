"""The algorithm menu's formulas against hand-computed cases: advantage estimators (GRPO, Dr. GRPO,
RLOO, REINFORCE++), KL estimators (exact expectations over a categorical), DAPO's overlong shaping,
the four loss aggregations, and the policy losses (PPO clip with clip-higher and dual-clip, GSPO's
sequence ratio, CISPO's stop-gradient weight) with their gradients from autograd."""

from __future__ import annotations

import math

import pytest
import torch

from tandem.sidecars.algorithms import estimators as est
from tandem.sidecars.algorithms import functional as F


def test_rloo_is_the_reward_minus_the_mean_of_the_others() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.3, 0.9])
    groups = [0, 0, 0, 0, 1, 1]
    adv = est.outcome_advantages("rloo", rewards, groups)
    for i in range(4):
        others = [rewards[j] for j in range(4) if j != i]
        assert float(adv[i]) == pytest.approx(float(rewards[i] - sum(others) / 3))
    assert adv[4:].tolist() == pytest.approx([-0.6, 0.6])


def test_grpo_with_and_without_std() -> None:
    rewards, groups = torch.tensor([1.0, 0.0, 0.0, 1.0]), [0, 0, 0, 0]
    a = 0.5 / (float(rewards.std()) + 1e-6)
    assert est.outcome_advantages("grpo", rewards, groups).tolist() == pytest.approx([a, -a, -a, a])
    assert est.outcome_advantages("grpo", rewards, groups, norm_std=False).tolist() == [0.5, -0.5, -0.5, 0.5]
    with pytest.raises(ValueError, match="not an outcome advantage"):
        est.outcome_advantages("gae", rewards, groups)


def test_discounted_returns_and_reinforce_pp_whitening() -> None:
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    returns = est.discounted_returns(rewards, mask, gamma=0.5)
    assert returns.tolist() == [[0.25, 0.5, 1.0], [1.0, 2.0, 0.0]]
    adv = est.reinforce_pp(rewards, mask, gamma=0.5)
    on = adv[mask > 0]
    assert float(on.mean()) == pytest.approx(0.0, abs=1e-6)
    assert float(on.pow(2).mean()) == pytest.approx(1.0, abs=1e-4)  # whitened over the batch's tokens
    assert float(adv[1, 2]) == 0.0


def test_kl_estimators_have_the_exact_kl_as_expectation() -> None:
    """Under x ~ p, E[k1] = E[k3] = KL(p || q) exactly; k2 is the second-order one; k3 >= 0 everywhere."""
    p = torch.tensor([0.5, 0.3, 0.2])
    q = torch.tensor([0.2, 0.2, 0.6])
    kl = float((p * (p / q).log()).sum())
    for kind in ("k1", "k3"):
        assert float((p * est.kl(kind, p.log(), q.log())).sum()) == pytest.approx(kl, rel=1e-5)
    d = (p / q).log()
    assert est.kl("k2", p.log(), q.log()).tolist() == pytest.approx((0.5 * d * d).tolist())
    assert (est.kl("k3", p.log(), q.log()) >= 0).all()
    assert float(est.kl("k3", torch.tensor([math.log(2.0)]), torch.tensor([0.0]))) == pytest.approx(
        0.5 + math.log(2.0) - 1.0)
    with pytest.raises(ValueError, match="unknown KL estimator"):
        est.kl("k4", p, q)


@pytest.mark.parametrize(("length", "want"), [(50, 0.0), (80, 0.0), (90, -0.5), (99, -0.95), (100, -1.0),
                                              (120, -1.0)])
def test_overlong_penalty_is_linear_inside_the_buffer(length: int, want: float) -> None:
    assert est.overlong_penalty(length, max_tokens=100, buffer=20) == pytest.approx(want)
    assert est.overlong_penalty(length, max_tokens=100, buffer=20, penalty=2.0) == pytest.approx(2 * want)


def test_the_four_aggregations() -> None:
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    seq = torch.tensor([[0, 0, 0, -1], [1, -1, -1, -1]])
    on = mask > 0
    assert F.loss_weights(mask, seq, "token-mean")[on].tolist() == pytest.approx([0.25] * 4)
    assert F.loss_weights(mask, seq, "seq-mean-token-mean")[on].tolist() == pytest.approx([1 / 6] * 3 + [0.5])
    assert F.loss_weights(mask, seq, "seq-mean-token-sum")[on].tolist() == pytest.approx([0.5] * 4)
    assert F.loss_weights(mask, seq, "seq-mean-token-sum-norm", norm=10)[on].tolist() == pytest.approx([0.05] * 4)
    assert F.loss_weights(mask, seq, "token").tolist() == F.loss_weights(mask, seq, "token-mean").tolist()


def _loss(mode: str, logp: list[float], old: list[float], adv: list[float], seq: list[int],
          low: float = 0.2, high: float = 0.28, clip_c: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    lp = torch.tensor([logp], requires_grad=True)
    loss, _, _ = F.policy_loss(mode, lp, torch.tensor([old]), torch.tensor([adv]), torch.ones(1, len(logp)),
                               torch.tensor([seq]), low, high, clip_c)
    loss.sum().backward()
    assert lp.grad is not None
    return loss.detach()[0], lp.grad[0]


def test_ppo_clip_higher_and_dual_clip() -> None:
    up, down = math.log(1.5), math.log(0.5)
    loss, grad = _loss("clip", [up, down, up], [0.0, 0.0, 0.0], [1.0, -1.0, -1.0], [0, 1, 2])
    assert loss.tolist() == pytest.approx([-1.28, 0.8, 1.5])  # upper clip at 1 + 0.28; lower at 1 - 0.2
    assert grad.tolist() == pytest.approx([0.0, 0.0, 1.5])  # clipped tokens pass no gradient
    loss, grad = _loss("clip", [math.log(5.0)], [0.0], [-1.0], [0], clip_c=3.0)
    assert loss.tolist() == pytest.approx([3.0]) and grad.tolist() == [0.0]  # dual-clip caps -A x ratio at 3|A|
    loss, _ = _loss("clip", [math.log(2.0)], [0.0], [-1.0], [0], clip_c=3.0)
    assert loss.tolist() == pytest.approx([2.0])  # below the cap: PPO's own


def test_gspo_uses_the_sequence_ratio_on_every_token() -> None:
    loss, grad = _loss("gspo", [0.1, 0.3, -0.2], [0.0, 0.0, 0.0], [1.0, 1.0, -1.0], [0, 0, 1], low=0.5, high=0.5)
    s0, s1 = math.exp(0.2), math.exp(-0.2)  # exp(mean log-ratio) of each sequence
    assert loss.tolist() == pytest.approx([-s0, -s0, s1])
    assert grad.tolist() == pytest.approx([-s0, -s0, s1])  # d/d log pi_t of s x pi_t / sg(pi_t) = s
    loss, grad = _loss("gspo", [0.1, 0.3], [0.0, 0.0], [1.0, 1.0], [0, 0], low=3e-4, high=4e-4)
    assert loss.tolist() == pytest.approx([-(1 + 4e-4)] * 2) and grad.tolist() == [0.0, 0.0]  # clipped sequence


def test_cispo_keeps_a_bounded_gradient_on_clipped_tokens() -> None:
    loss, grad = _loss("cispo", [math.log(1.5), math.log(1.1)], [0.0, 0.0], [2.0, 2.0], [0, 1], low=1.0, high=0.28)
    assert grad.tolist() == pytest.approx([-1.28 * 2.0, -1.1 * 2.0])  # PPO would pass 0 for the first
    assert loss.tolist() == pytest.approx([-1.28 * 2.0 * math.log(1.5), -1.1 * 2.0 * math.log(1.1)])
    with pytest.raises(ValueError, match="unknown policy loss"):
        _loss("ppo2", [0.0], [0.0], [1.0], [0])
