"""GRPO / PPO / DPO through the common interface: prepare, loss, micro-batch splits, spec choice."""

from __future__ import annotations

import math

import pytest
import torch

from tandem.sidecars.algorithms import (
    DPO,
    GRPO,
    PPO,
    Algorithm,
    AlgorithmError,
    Sample,
    make_algorithm,
    preference_pairs,
)
from tandem.sidecars.algorithms import functional as F
from tandem.spec.models import Algorithm as AlgorithmSpec


def _samples() -> list[Sample]:
    # two prompts x two completions; lengths differ so packing matters
    return [
        Sample([1, 2], [3, 4], group=0, reward=1.0, ref_logprobs=[-1.0, -1.0], old_logprobs=[-1.0, -1.2]),
        Sample([1, 2], [5], group=0, reward=0.0, ref_logprobs=[-2.0], old_logprobs=[-2.0]),
        Sample([6], [7, 8, 9], group=1, reward=0.5, ref_logprobs=[-1.0] * 3, old_logprobs=[-0.5] * 3),
        Sample([6], [7], group=1, reward=0.5, ref_logprobs=[-1.0], old_logprobs=[-0.5]),
    ]


def test_make_algorithm_from_spec() -> None:
    for name, cls in (("grpo", GRPO), ("ppo", PPO), ("dpo", DPO)):
        spec = AlgorithmSpec.model_validate({"name": name, "clip": 0.3, "klCoef": 0.05, "beta": 0.2})
        algo = make_algorithm(spec)
        assert isinstance(algo, cls) and isinstance(algo, Algorithm) and algo.name == name
    grpo = make_algorithm(AlgorithmSpec.model_validate({}))
    assert isinstance(grpo, GRPO) and grpo.clip == 0.2 and grpo.reduction == "token-mean"
    ppo_spec = {"name": "ppo", "critic": True, "gamma": 0.9, "lam": 0.5}
    ppo = make_algorithm(AlgorithmSpec.model_validate(ppo_spec))
    assert isinstance(ppo, PPO) and ppo.needs_values and ppo.gamma == 0.9 and ppo.lam == 0.5


def test_grpo_prepare_and_loss_by_hand() -> None:
    samples = _samples()
    algo = GRPO(clip=0.2, kl_coef=0.1)
    batch = algo.prepare(samples, token_budget=8)
    adv = batch.unpack(batch.token_fields["advantages"])
    s = math.sqrt(0.5)  # group 0: rewards 1, 0 -> mean .5, unbiased std sqrt(.5)
    assert adv[0].tolist() == pytest.approx([0.5 / s] * 2, rel=1e-4)
    assert adv[1].tolist() == pytest.approx([-0.5 / s], rel=1e-4)
    assert adv[2].tolist() == [0.0] * 3 and batch.stats["flat_group_frac"] == 0.5
    # policy = old everywhere: ratio 1, pg per token = -A; KL against ref by k3
    lp = batch.token_fields["old_logprobs"].clone().requires_grad_(True)
    loss, metrics = algo.loss(lp, batch)
    tokens = 7
    kl = [F.kl_k3(torch.tensor(o), torch.tensor(r)).item() for o, r in
          [(-1.0, -1.0), (-1.2, -1.0), (-2.0, -2.0)] + [(-0.5, -1.0)] * 4]
    want = (-(0.5 / s) * 2 + (0.5 / s) + 0.1 * sum(kl)) / tokens
    assert loss.item() == pytest.approx(want, rel=1e-4)
    assert metrics["ratio_mean"] == pytest.approx(1.0) and metrics["clip_frac"] == 0.0
    loss.backward()
    assert lp.grad is not None and (lp.grad[batch.loss_mask == 0] == 0).all()


def test_grpo_split_losses_sum_to_full_loss() -> None:
    torch.manual_seed(1)
    samples = [Sample([1, 2, 3][: 1 + i % 3], [4] * (1 + i % 4), group=i // 4, reward=float(i % 3),
                      ref_logprobs=[-1.0] * (1 + i % 4)) for i in range(16)]
    for reduction in ("token", "sequence"):
        algo = GRPO(kl_coef=0.05, reduction=reduction)
        batch = algo.prepare(samples, token_budget=10)
        lp = -torch.rand(batch.num_rows, batch.row_length)
        full, _ = algo.loss(lp, batch)
        parts = batch.split(3)
        offs = [0]
        for p in parts:
            offs.append(offs[-1] + p.num_rows)
        total = sum(algo.loss(lp[offs[i]:offs[i + 1]], p)[0] for i, p in enumerate(parts))
        assert float(total) == pytest.approx(float(full), rel=1e-5)


def test_grpo_requires_reference_when_kl_on() -> None:
    samples = [Sample([1], [2], group=0, reward=1.0), Sample([1], [3], group=0, reward=0.0)]
    with pytest.raises(AlgorithmError):
        GRPO(kl_coef=0.1).prepare(samples, 8)
    batch = GRPO(kl_coef=0.0).prepare(samples, 8)
    assert "ref_logprobs" not in batch.token_fields


def test_ppo_prepare_without_critic_uses_group_baseline() -> None:
    samples = _samples()
    algo = PPO(kl_coef=0.0, gamma=1.0, lam=1.0, whiten=False)
    batch = algo.prepare(samples, token_budget=8)
    adv = batch.unpack(batch.token_fields["advantages"])
    # constant baseline b = group mean; gamma = lam = 1: A_t = reward - b at every step
    assert adv[0].tolist() == pytest.approx([0.5, 0.5])
    assert adv[1].tolist() == pytest.approx([-0.5])
    assert adv[2].tolist() == pytest.approx([0.0, 0.0, 0.0])
    ret = batch.unpack(batch.token_fields["returns"])
    assert ret[0].tolist() == pytest.approx([1.0, 1.0])


def test_ppo_kl_in_reward_and_gae_by_hand() -> None:
    s = Sample([1], [2, 3, 4], group=0, reward=1.0, old_logprobs=[-1.0, -1.0, -1.0],
               ref_logprobs=[-1.5, -1.0, -1.0], values=[0.5, 0.6, 0.7])
    algo = PPO(kl_coef=0.2, gamma=0.9, lam=0.8, critic=True, whiten=False)
    assert algo.token_rewards([s]) == [pytest.approx([-0.1, 0.0, 1.0])]
    batch = algo.prepare([s], token_budget=8)
    a2 = 1.0 - 0.7
    a1 = 0.9 * 0.7 - 0.6 + 0.72 * a2
    a0 = -0.1 + 0.9 * 0.6 - 0.5 + 0.72 * a1
    assert batch.unpack(batch.token_fields["advantages"])[0].tolist() == pytest.approx([a0, a1, a2], abs=1e-6)
    values = batch.token_fields["old_values"].clone()
    vloss, _ = algo.critic_loss(values, batch)
    rets = [a0 + 0.5, a1 + 0.6, a2 + 0.7]
    want = sum(0.5 * (v - r) ** 2 for v, r in zip([0.5, 0.6, 0.7], rets, strict=True)) / 3
    assert vloss.item() == pytest.approx(want, rel=1e-5)
    with pytest.raises(AlgorithmError):
        PPO(critic=True, kl_coef=0.0).prepare([Sample([1], [2], group=0)], 8)


def test_ppo_whitened_loss_runs_and_clips() -> None:
    samples = _samples()
    algo = PPO(kl_coef=0.01)
    batch = algo.prepare(samples, token_budget=8)
    adv = batch.token_fields["advantages"][batch.loss_mask > 0]
    assert adv.mean().item() == pytest.approx(0.0, abs=1e-5)
    lp = batch.token_fields["old_logprobs"] + 1.0  # ratio e: outside the range everywhere
    _, metrics = algo.loss(lp, batch)
    assert metrics["ratio_mean"] == pytest.approx(math.e, rel=1e-4)
    assert 0.0 < metrics["clip_frac"] <= 1.0


def test_dpo_pairs_skip_ties_and_loss_by_hand() -> None:
    samples = [
        Sample([1], [2, 3], group=0, reward=0.0, ref_logprobs=[-1.0, -1.0]),
        Sample([1], [4], group=0, reward=1.0, ref_logprobs=[-0.5]),
        Sample([1], [5], group=0, reward=1.0, ref_logprobs=[-0.2]),  # tie with 1: first wins
        Sample([6], [7], group=1, reward=0.3, ref_logprobs=[-1.0]),
        Sample([6], [8], group=1, reward=0.3, ref_logprobs=[-1.0]),  # tied group: no pair
    ]
    assert preference_pairs(samples) == [(1, 0)]
    algo = DPO(beta=0.5)
    batch = algo.prepare(samples, token_budget=8)
    assert {p.sample for p in batch.placements} == {0, 1} and batch.stats["pairs"] == 1.0
    assert len({p.row for p in batch.placements}) == 1
    # policy: chosen -0.25; rejected -1.5 - 1.5 = -3.0; ref: chosen -0.5, rejected -2.0
    per = {1: [-0.25], 0: [-1.5, -1.5]}
    lp = batch.scatter([per.get(i, []) if i in per else [] for i in range(2)])
    loss, metrics = algo.loss(lp, batch)
    margin = 0.5 * ((-0.25 + 0.5) - (-3.0 + 2.0))
    assert metrics["reward_margin"] == pytest.approx(margin)
    assert loss.item() == pytest.approx(math.log(1 + math.exp(-margin)), rel=1e-6)


def test_dpo_split_matches_full_and_empty_batch() -> None:
    torch.manual_seed(0)
    samples = [Sample([1, 2], [3] * (1 + i % 3), group=i // 2, reward=float(i % 2),
                      ref_logprobs=[-1.0] * (1 + i % 3)) for i in range(12)]
    algo = DPO(beta=0.1)
    batch = algo.prepare(samples, token_budget=10)
    lp = -torch.rand(batch.num_rows, batch.row_length)
    full, _ = algo.loss(lp, batch)
    total = 0.0
    for lo in range(batch.num_rows):
        total += float(algo.loss(lp[lo:lo + 1], batch.rows(lo, lo + 1))[0])
    assert total == pytest.approx(float(full), rel=1e-5)
    tied = [Sample([1], [2], group=0, reward=1.0, ref_logprobs=[-1.0])] * 2
    empty = algo.prepare(tied, token_budget=8)
    assert empty.num_rows == 0
    with pytest.raises(AlgorithmError):
        algo.loss(torch.zeros(0, 1), empty)
    with pytest.raises(AlgorithmError):
        algo.prepare([Sample([1], [2], group=0, reward=1.0), Sample([1], [3], group=0)], 8)


def test_normalised_part_is_its_own_batch() -> None:
    samples = [Sample([1, 2], [3] * (1 + i % 3), group=i // 2, reward=float(i % 2),
                      ref_logprobs=[-1.0] * (1 + i % 3)) for i in range(12)]
    grpo = GRPO(kl_coef=0.0).prepare(samples, token_budget=10)
    part = grpo.split(2)[0].normalised()
    assert part.weights is not None and float(part.weights.sum()) == pytest.approx(1.0)
    dpo = DPO().prepare(samples, token_budget=10)
    one = dpo.rows(0, 1).normalised()
    assert one.stats["pairs"] == float(len({int(p) for p in one.seq_fields["pair"]}))
    lp = -torch.rand(one.num_rows, one.row_length)
    loss, metrics = DPO().loss(lp, one)
    assert loss.item() == pytest.approx(metrics["dpo_loss"], rel=1e-5)  # mean over its own pairs


@pytest.mark.parametrize("algo", [GRPO(kl_coef=0.1), PPO(kl_coef=0.1)])
def test_extreme_logprobs_outside_the_mask_leave_gradients_finite(algo: GRPO | PPO) -> None:
    samples = _samples()
    batch = algo.prepare(samples, token_budget=8)
    lp = torch.full((batch.num_rows, batch.row_length), -1000.0)  # padding/prompt: tiny probabilities
    lp = torch.where(batch.loss_mask > 0, batch.token_fields["old_logprobs"], lp).requires_grad_(True)
    loss, _ = algo.loss(lp, batch)
    loss.backward()
    assert torch.isfinite(loss) and lp.grad is not None and torch.isfinite(lp.grad).all()
    assert (lp.grad[batch.loss_mask == 0] == 0).all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_losses_follow_the_logprobs_device() -> None:
    samples = _samples()
    for algo in (GRPO(kl_coef=0.1), PPO(kl_coef=0.1), DPO()):
        batch = algo.prepare(samples, token_budget=8)  # prepared on the CPU
        lp = -torch.rand(batch.num_rows, batch.row_length)
        cpu, _ = algo.loss(lp, batch)
        gpu, _ = algo.loss(lp.cuda(), batch)
        assert gpu.device.type == "cuda" and gpu.item() == pytest.approx(cpu.item(), rel=1e-5)
