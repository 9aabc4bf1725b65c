"""KTO (`tandem.sidecars.algorithms.kto`): the loss and its gradient against the paper's formula worked
out by hand on a fixed batch, z0 from the mismatched KL probes, micro-batch splits adding up to the
whole batch, and the errors for a batch it cannot train on."""

from __future__ import annotations

import math

import pytest
import torch

from tandem.sidecars.algorithms import KTO, Algorithm, AlgorithmError, Sample, make_algorithm
from tandem.sidecars.algorithms.kto import kl_probes
from tandem.spec.models import Algorithm as AlgorithmSpec

BETA, LAMBDA_D, LAMBDA_U = 0.5, 1.0, 1.5


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def batch_samples(probe_policy: float) -> list[Sample]:
    """Three labelled examples and their KL probes; each probe's policy log-prob per token is
    `probe_policy`, its reference's -1, so z0 = mean over probes of (probe_policy + 1) x length."""
    examples = [
        Sample([1, 2], [3, 4], group=0, desirable=True, ref_logprobs=[-1.0, -2.0]),
        Sample([5], [6], group=1, desirable=False, ref_logprobs=[-0.5]),
        Sample([7, 8], [9, 10, 11], group=2, desirable=True, ref_logprobs=[-0.5, -0.5, -0.5]),
    ]
    probes = kl_probes(examples)
    for p in probes:
        p.old_logprobs = [probe_policy] * len(p.completion_ids)
        p.ref_logprobs = [-1.0] * len(p.completion_ids)
    for e in examples:
        e.old_logprobs = list(e.ref_logprobs or [])  # before the first step the policy is the reference
    return examples + probes


# the policy's log-probs per completion token of each example (sample index -> tokens)
POLICY = {0: [-0.5, -1.0], 1: [-2.0], 2: [-0.2, -0.4, -0.3]}


def test_kl_probes_pair_each_prompt_with_the_next_completion() -> None:
    samples = batch_samples(-1.0)
    probes = [s for s in samples if s.kl_probe]
    assert [(p.prompt_ids, p.completion_ids) for p in probes] == [([1, 2], [6]), ([5], [9, 10, 11]),
                                                                   ([7, 8], [3, 4])]
    assert all(p.desirable is None for p in probes) and [p.group for p in probes] == [0, 1, 2]


@pytest.mark.parametrize("share_prompts", [False, True])
def test_loss_and_gradient_by_hand(share_prompts: bool) -> None:
    samples = batch_samples(-0.8)  # probe log-ratios: 0.2 x (1, 3, 2) tokens
    z0 = (0.2 * 1 + 0.2 * 3 + 0.2 * 2) / 3
    algo = KTO(beta=BETA, desirable_weight=LAMBDA_D, undesirable_weight=LAMBDA_U, share_prompts=share_prompts)
    batch = algo.prepare(samples, token_budget=16)
    assert sorted(p.sample for p in batch.placements) == [0, 1, 2]  # the probes are not trained on
    assert batch.stats["kl"] == pytest.approx(z0)
    assert batch.stats["examples"] == 3 and batch.stats["desirable"] == pytest.approx(2 / 3)
    assert batch.stats["rewards_chosen"] == 0.0 and batch.stats["rewards_rejected"] == 0.0  # policy = ref

    lp = batch.scatter([POLICY.get(i, []) for i in range(len(samples))]).requires_grad_(True)
    loss, metrics = algo.loss(lp, batch)
    loss.backward()
    r = {0: (-0.5 - 1.0) - (-1.0 - 2.0), 1: -2.0 - (-0.5), 2: (-0.2 - 0.4 - 0.3) - (-1.5)}
    x = {0: BETA * (r[0] - z0), 1: BETA * (z0 - r[1]), 2: BETA * (r[2] - z0)}
    per = {0: LAMBDA_D * (1 - sigmoid(x[0])), 1: LAMBDA_U * (1 - sigmoid(x[1])), 2: LAMBDA_D * (1 - sigmoid(x[2]))}
    assert loss.item() == pytest.approx(sum(per.values()) / 3, rel=1e-6)
    assert metrics["kl"] == pytest.approx(z0) and metrics["examples"] == 3.0
    # d loss / d log pi(token): the same for every token of an example (r is a sum)
    grad = {0: -LAMBDA_D * BETA * sigmoid(x[0]) * (1 - sigmoid(x[0])) / 3,
            1: LAMBDA_U * BETA * sigmoid(x[1]) * (1 - sigmoid(x[1])) / 3,
            2: -LAMBDA_D * BETA * sigmoid(x[2]) * (1 - sigmoid(x[2])) / 3}
    assert lp.grad is not None
    got = batch.unpack(lp.grad)
    for i, g in grad.items():
        assert got[i].tolist() == pytest.approx([g] * len(POLICY[i]), rel=1e-5)
    assert float(lp.grad[batch.loss_mask == 0].abs().sum()) == 0.0


def test_micro_batch_losses_add_up_to_the_whole_batch() -> None:
    torch.manual_seed(0)
    examples = [Sample([1 + i % 3, 2], [3] * (1 + i % 4), group=i, desirable=i % 3 != 0,
                       ref_logprobs=[-1.0] * (1 + i % 4)) for i in range(10)]
    samples = examples + kl_probes(examples)
    for s in samples:
        s.ref_logprobs = [-1.0] * len(s.completion_ids)
        s.old_logprobs = [-0.7] * len(s.completion_ids)
    algo = KTO(beta=0.1, desirable_weight=1.3, undesirable_weight=0.7)
    batch = algo.prepare(samples, token_budget=8)
    assert batch.num_rows > 2
    lp = -torch.rand(batch.num_rows, batch.row_length)
    full, _ = algo.loss(lp, batch)
    parts = sum(float(algo.loss(lp[lo:lo + 1], batch.rows(lo, lo + 1))[0]) for lo in range(batch.num_rows))
    assert parts == pytest.approx(float(full), rel=1e-5)
    lo, parts = 0, 0.0
    for part in batch.split(2):  # as the trainer splits a batch into optimizer steps
        parts += float(algo.loss(lp[lo:lo + part.num_rows], part)[0])
        lo += part.num_rows
    assert parts == pytest.approx(float(full), rel=1e-5)


def test_z0_is_clamped_at_zero_and_pre_step_rewards() -> None:
    samples = batch_samples(-1.5)  # the probes' log-ratios are negative: z0 = 0, not below
    for e in samples[:3]:
        e.old_logprobs = [lp + 0.1 for lp in e.ref_logprobs or []]  # beta r = 0.5 x 0.1 x tokens
    batch = KTO(beta=BETA).prepare(samples, token_budget=16)
    assert batch.stats["kl"] == 0.0
    assert batch.stats["rewards_chosen"] == pytest.approx(BETA * (0.2 + 0.3) / 2)
    assert batch.stats["rewards_rejected"] == pytest.approx(BETA * 0.1)
    chosen = [1 - sigmoid(BETA * 0.2), 1 - sigmoid(BETA * 0.3)]
    assert batch.stats["kto_loss"] == pytest.approx((sum(chosen) + 1 - sigmoid(-BETA * 0.1)) / 3)


def test_what_kto_cannot_train_on() -> None:
    samples = batch_samples(-1.0)
    algo = KTO()
    with pytest.raises(AlgorithmError, match="KL probes"):
        algo.prepare(samples[:3], token_budget=16)
    with pytest.raises(AlgorithmError, match="no labelled example"):
        algo.prepare(samples[3:], token_budget=16)
    samples[1].desirable = None
    with pytest.raises(AlgorithmError, match=r"label .*sample 1"):
        algo.prepare(samples, token_budget=16)
    samples = batch_samples(-1.0)
    samples[4].ref_logprobs = None
    with pytest.raises(AlgorithmError, match="sample 4"):
        algo.prepare(samples, token_budget=16)


def test_made_from_the_spec() -> None:
    spec = AlgorithmSpec.model_validate({"name": "kto", "beta": 0.2, "desirableWeight": 1.33,
                                         "undesirableWeight": 0.5})
    algo = make_algorithm(spec, pad_id=7, share_prompts=True)
    assert isinstance(algo, KTO) and isinstance(algo, Algorithm) and algo.name == "kto"
    assert (algo.beta, algo.desirable_weight, algo.undesirable_weight, algo.pad_id, algo.share_prompts) == (
        0.2, 1.33, 0.5, 7, True)
    assert algo.needs_reference and algo.needs_old_logprobs and not algo.needs_values
