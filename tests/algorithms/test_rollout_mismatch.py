"""Rollout/trainer log-prob mismatch and truncated or masked importance sampling (tisCap, tisMode).

`rollout_correction.weights` by hand (exact over uneven micro-batches); GRPO and PPO losses with
`Sample.rollout_logprobs` against the weighted surrogate computed here token by token, including stale samples whose
behaviour log-probs come from segments sampled by different versions (partial rollouts).
"""

from __future__ import annotations

import math

import pytest
import torch

from tandem.sidecars.algorithms import GRPO, PPO, AlgorithmError, Sample, make_algorithm
from tandem.sidecars.algorithms import rollout_correction as RC
from tandem.spec.models import Algorithm as AlgorithmSpec

# ---- rollout_correction.weights: the mismatch, exact over micro-batches ---------------------------------------


def _measured(trainer: torch.Tensor, rollout: torch.Tensor, mask: torch.Tensor,
              correction: RC.Correction | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    seq = torch.where(mask > 0, torch.arange(mask.shape[0]).unsqueeze(1).expand_as(mask), -1)
    w, stats = RC.weights(trainer, rollout, mask, seq, correction)
    return w, RC.summarize(stats)


def test_mismatch_metrics_count_only_masked_tokens() -> None:
    # position 3 is padding/prompt: a huge gap there must not show in any metric
    trainer = torch.tensor([[-1.0, -0.5, -2.0, 5.0]])
    rollout = torch.tensor([[-1.2, -0.5, -1.0, -30.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    weights, m = _measured(trainer, rollout, mask)
    assert m["mismatch_mean"] == pytest.approx((0.2 + 0.0 + 1.0) / 3, rel=1e-6)
    assert m["mismatch_max"] == pytest.approx(1.0, rel=1e-6)
    assert "tis_clip_frac" not in m  # no cap: measurement only
    assert torch.equal(weights, torch.ones_like(trainer))


def test_truncated_weights_and_clip_fraction_by_hand() -> None:
    trainer = torch.tensor([[-1.0, -0.5, -2.0, 5.0], [-0.1, -3.0, 0.0, 0.0]])
    rollout = torch.tensor([[-1.2, -0.5, -1.0, -30.0], [-1.0, -1.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    cap = 1.5
    weights, m = _measured(trainer, rollout, mask, RC.Correction(high=cap))
    # masked tokens: d = trainer - rollout = 0.2, 0, -1, 0.9, -2
    d = [0.2, 0.0, -1.0, 0.9, -2.0]
    want = [min(math.exp(x), cap) for x in d]
    got = weights[mask > 0].tolist()
    assert got == pytest.approx(want, rel=1e-6)
    assert m["mismatch_mean"] == pytest.approx(sum(abs(x) for x in d) / 5, rel=1e-6)
    assert m["mismatch_max"] == pytest.approx(2.0, rel=1e-6)
    # exp(0.2) = 1.22 and exp(0.9) = 2.46: only the second exceeds 1.5 (padding's e^35 does not count)
    assert m["tis_clip_frac"] == pytest.approx(1 / 5, rel=1e-6)
    assert float(weights.max()) <= cap


def test_batch_figures_are_exact_over_uneven_micro_batches() -> None:
    """Two micro-batches of 1 and 4 tokens, their sums added as the engines add them: mismatch_mean and
    tis_clip_frac are the whole batch's (2/5 tokens over the cap), not the mean of the two micro-batches'
    shares (1/2 (1/1 + 1/4) = 0.625), and mismatch_max the larger of the two."""
    from tandem.sidecars.trainer.engines.common import accumulate

    cap = RC.Correction(high=1.5)
    parts = [(torch.tensor([[-0.1]]), torch.tensor([[-1.0]]), torch.ones(1, 1)),
             (torch.tensor([[-1.0, -0.5, -2.0, -0.1]]), torch.tensor([[-1.2, -0.5, -1.0, -3.0]]), torch.ones(1, 4))]
    sums: dict[str, float] = {}
    for trainer, rollout, mask in parts:
        _, stats = RC.weights(trainer, rollout, mask, torch.zeros_like(mask, dtype=torch.int64), cap)
        accumulate(sums, stats)
    m = RC.summarize(sums)
    gaps = [0.9, 0.2, 0.0, 1.0, 2.9]
    assert m["mismatch_mean"] == pytest.approx(sum(gaps) / 5, rel=1e-6)
    assert m["mismatch_max"] == pytest.approx(2.9, rel=1e-6)
    assert m["tis_clip_frac"] == pytest.approx(2 / 5, rel=1e-6)  # e^0.9 and e^2.9 exceed 1.5


def test_weights_carry_no_gradient() -> None:
    trainer = torch.tensor([[-1.0, -0.5]], requires_grad=True)
    weights, _ = _measured(trainer, torch.tensor([[-1.5, -0.4]]), torch.ones(1, 2), RC.Correction(high=2.0))
    assert not weights.requires_grad


def test_empty_mask_gives_zero_metrics() -> None:
    trainer = torch.tensor([[-1.0, 4.0]])
    rollout = torch.tensor([[-9.0, -9.0]])
    _, m = _measured(trainer, rollout, torch.zeros(1, 2), RC.Correction(high=2.0))
    assert m["mismatch_mean"] == 0.0 and m["mismatch_max"] == 0.0 and m["tis_clip_frac"] == 0.0


# ---- GRPO / PPO ----------------------------------------------------------------------------------

# per completion token: the rollout engine's log-probs, the trainer's old log-probs, and the current
# policy's log-probs (the loss input); rewards make both groups informative
ROLLOUT = [[-1.0, -0.3], [-2.5], [-0.1, -0.1], [-3.0]]
OLD = [[-1.0, -1.0], [-1.0], [-0.5, -0.5], [-1.0]]
CURRENT = [[-0.9, -1.3], [-1.0], [-0.5, -0.2], [-1.1]]
REWARDS = [1.0, 0.0, 0.0, 1.0]
GROUPS = [0, 0, 1, 1]
PROMPTS = [[1, 2], [1, 2], [6], [6]]
COMPLETIONS = [[3, 4], [5], [7, 8], [9]]


def samples(*, rollout: bool = True, old: bool = True) -> list[Sample]:
    return [Sample(PROMPTS[i], COMPLETIONS[i], group=GROUPS[i], reward=REWARDS[i],
                   old_logprobs=OLD[i] if old else None, rollout_logprobs=ROLLOUT[i] if rollout else None)
            for i in range(4)]


def grpo_advantages() -> list[float]:
    # each group: rewards (1, 0) or (0, 1) -> mean 0.5, unbiased std sqrt(0.5)
    a = 0.5 / math.sqrt(0.5)
    return [a, -a, -a, a]


def surrogate(lp: float, old: float, adv: float, clip: float) -> float:
    ratio = math.exp(lp - old)
    return -min(ratio * adv, max(min(ratio, 1 + clip), 1 - clip) * adv)


def expected_loss(advs: list[list[float]], cap: float | None, clip: float, *, current: list[list[float]],
                  old: list[list[float]], rollout: list[list[float]] | None) -> float:
    """Token-mean of the clipped surrogate, each token weighed by min(p_old / p_rollout, cap)."""
    total, tokens = 0.0, 0
    for i in range(4):
        for j, lp in enumerate(current[i]):
            w = 1.0
            if rollout is not None and cap is not None:
                w = min(math.exp(old[i][j] - rollout[i][j]), cap)
            total += surrogate(lp, old[i][j], advs[i][j], clip) * w
            tokens += 1
    return total / tokens


def test_grpo_loss_with_tis_cap_is_the_weighted_surrogate() -> None:
    cap, clip = 2.0, 0.2
    algo = GRPO(clip=clip, kl_coef=0.0, tis_cap=cap)
    batch = algo.prepare(samples(), token_budget=8)
    assert "rollout_logprobs" in batch.token_fields
    unpacked = batch.unpack(batch.token_fields["rollout_logprobs"])
    assert [unpacked[i].tolist() for i in range(4)] == [pytest.approx(r) for r in ROLLOUT]
    lp = batch.scatter(CURRENT).requires_grad_(True)
    loss, m = algo.loss(lp, batch)
    m = RC.summarize(m)  # the rc_ sums as the train phase turns them into the batch's figures
    advs = [[a] * len(c) for a, c in zip(grpo_advantages(), COMPLETIONS, strict=True)]
    want = expected_loss(advs, cap, clip, current=CURRENT, old=OLD, rollout=ROLLOUT)
    assert loss.item() == pytest.approx(want, rel=1e-5)
    # the weights are against the trainer's OLD log-probs: d = old - rollout per token
    d = [o - r for os_, rs in zip(OLD, ROLLOUT, strict=True) for o, r in zip(os_, rs, strict=True)]
    assert m["mismatch_mean"] == pytest.approx(sum(abs(x) for x in d) / len(d), rel=1e-5)
    assert m["mismatch_max"] == pytest.approx(max(abs(x) for x in d), rel=1e-5)
    assert m["tis_clip_frac"] == pytest.approx(sum(math.exp(x) > cap for x in d) / len(d), rel=1e-5)
    # d/d lp of token (0, 0): inside the clip range the surrogate is -A * ratio, times the constant weight
    loss.backward()
    assert lp.grad is not None
    p = batch.placements[next(k for k, pl in enumerate(batch.placements) if pl.sample == 0)]
    pos = p.start + p.prompt_len - 1
    ratio = math.exp(CURRENT[0][0] - OLD[0][0])
    w = min(math.exp(OLD[0][0] - ROLLOUT[0][0]), cap)
    assert lp.grad[p.row, pos].item() == pytest.approx(-grpo_advantages()[0] * ratio * w / 6, rel=1e-5)
    assert (lp.grad[batch.loss_mask == 0] == 0).all()


def test_grpo_without_old_logprobs_weighs_by_the_current_policy() -> None:
    """On-policy GRPO (no old_logprobs): ratio 1, pg = -A, weight min(p_current / p_rollout, cap)."""
    cap = 1.5
    algo = GRPO(kl_coef=0.0, tis_cap=cap)
    batch = algo.prepare(samples(old=False), token_budget=8)
    loss, m = algo.loss(batch.scatter(CURRENT), batch)
    m = RC.summarize(m)
    advs = [[a] * len(c) for a, c in zip(grpo_advantages(), COMPLETIONS, strict=True)]
    want = expected_loss(advs, cap, 0.2, current=CURRENT, old=CURRENT, rollout=ROLLOUT)
    assert loss.item() == pytest.approx(want, rel=1e-5)
    assert m["ratio_mean"] == pytest.approx(1.0)
    d = [c - r for cs, rs in zip(CURRENT, ROLLOUT, strict=True) for c, r in zip(cs, rs, strict=True)]
    assert m["tis_clip_frac"] == pytest.approx(sum(math.exp(x) > cap for x in d) / len(d), rel=1e-5)


@pytest.mark.parametrize("algo", [GRPO(kl_coef=0.05), PPO(kl_coef=0.0)], ids=["grpo", "ppo"])
def test_without_cap_the_loss_is_unchanged_and_mismatch_is_measured(algo: GRPO | PPO) -> None:
    ref = {"ref_logprobs": [[-1.2, -0.8], [-1.5], [-0.4, -0.6], [-0.9]]}
    with_r = samples()
    without = samples(rollout=False)
    for s, r in zip(with_r + without, ref["ref_logprobs"] * 2, strict=True):
        s.ref_logprobs = r
    a = algo.prepare(with_r, token_budget=8)
    b = algo.prepare(without, token_budget=8)
    assert "rollout_logprobs" not in b.token_fields
    la, ma = algo.loss(a.scatter(CURRENT), a)
    lb, mb = algo.loss(b.scatter(CURRENT), b)
    ma, mb = RC.summarize(ma), RC.summarize(mb)
    assert la.item() == pytest.approx(lb.item(), rel=1e-6)
    assert "mismatch_mean" in ma and "mismatch_mean" not in mb and "tis_clip_frac" not in ma
    d = [o - r for os_, rs in zip(OLD, ROLLOUT, strict=True) for o, r in zip(os_, rs, strict=True)]
    assert ma["mismatch_mean"] == pytest.approx(sum(abs(x) for x in d) / len(d), rel=1e-5)


def test_ppo_loss_with_tis_cap_is_the_weighted_surrogate() -> None:
    cap, clip = 1.2, 0.2
    algo = PPO(clip=clip, kl_coef=0.0, gamma=1.0, lam=1.0, whiten=False, tis_cap=cap)
    batch = algo.prepare(samples(), token_budget=8)
    lp = batch.scatter(CURRENT)
    loss, m = algo.loss(lp, batch)
    m = RC.summarize(m)
    # group baseline, gamma = lam = 1: A_t = reward - group mean (0.5) on every token
    advs = [[r - 0.5] * len(c) for r, c in zip(REWARDS, COMPLETIONS, strict=True)]
    want = expected_loss(advs, cap, clip, current=CURRENT, old=OLD, rollout=ROLLOUT)
    assert loss.item() == pytest.approx(want, rel=1e-5)
    d = [o - r for os_, rs in zip(OLD, ROLLOUT, strict=True) for o, r in zip(os_, rs, strict=True)]
    assert m["tis_clip_frac"] == pytest.approx(sum(math.exp(x) > cap for x in d) / len(d), rel=1e-5)
    # the cap changes the loss (some weights are < 1 and some truncated): not the unweighted surrogate
    plain = expected_loss(advs, None, clip, current=CURRENT, old=OLD, rollout=None)
    assert abs(want - plain) > 1e-3


@pytest.mark.parametrize("algo", [GRPO(kl_coef=0.0, tis_cap=2.0), PPO(kl_coef=0.0, tis_cap=2.0)],
                         ids=["grpo", "ppo"])
def test_split_micro_batches_sum_to_the_full_weighted_loss(algo: GRPO | PPO) -> None:
    torch.manual_seed(3)
    many = [Sample([1, 2, 3][: 1 + i % 3], [4] * (1 + i % 4), group=i // 4, reward=float(i % 3),
                   rollout_logprobs=(-torch.rand(1 + i % 4) * 2).tolist(),
                   old_logprobs=(-torch.rand(1 + i % 4) * 2).tolist()) for i in range(16)]
    batch = algo.prepare(many, token_budget=10)
    lp = -torch.rand(batch.num_rows, batch.row_length) * 2
    full, _ = algo.loss(lp, batch)
    parts = batch.split(3)
    offs = [0]
    for p in parts:
        offs.append(offs[-1] + p.num_rows)
    total = sum(float(algo.loss(lp[offs[i]:offs[i + 1]], p)[0]) for i, p in enumerate(parts))
    assert total == pytest.approx(float(full), rel=1e-5)


@pytest.mark.parametrize("algo", [GRPO(kl_coef=0.0), PPO(kl_coef=0.0)], ids=["grpo", "ppo"])
def test_rollout_logprobs_on_some_samples_only_are_refused(algo: GRPO | PPO) -> None:
    mixed = samples()
    mixed[2].rollout_logprobs = None
    with pytest.raises(AlgorithmError, match="rollout_logprobs"):
        algo.prepare(mixed, token_budget=8)
    short = samples()
    short[0].rollout_logprobs = [-1.0]  # two completion tokens
    with pytest.raises(AlgorithmError, match="rollout_logprobs"):
        algo.prepare(short, token_budget=8)


def test_tis_cap_comes_from_the_spec() -> None:
    for name, cls in (("grpo", GRPO), ("ppo", PPO)):
        algo = make_algorithm(AlgorithmSpec.model_validate({"name": name, "tisCap": 3.0}))
        assert isinstance(algo, cls) and algo.tis_cap == 3.0
        plain = make_algorithm(AlgorithmSpec.model_validate({"name": name}))
        assert isinstance(plain, cls) and plain.tis_cap is None
    with pytest.raises(ValueError, match="tisCap"):
        AlgorithmSpec.model_validate({"name": "dpo", "tisCap": 2.0})
    with pytest.raises(ValueError, match="tisCap|tis_cap"):
        AlgorithmSpec.model_validate({"tisCap": 0.5})  # a cap below 1 would down-weigh every token


# ---- tisMode "mask" and stale (multi-segment) behaviour log-probs --------------------------------


def test_mask_mode_by_hand() -> None:
    trainer = torch.tensor([[-1.0, -0.5, -2.0, 5.0], [-0.1, -3.0, 0.0, 0.0]])
    rollout = torch.tensor([[-1.2, -0.5, -1.0, -30.0], [-1.0, -1.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    cap = 1.5
    weights, m = _measured(trainer, rollout, mask, RC.Correction(mode="mask", high=cap))
    d = [0.2, 0.0, -1.0, 0.9, -2.0]  # exp(0.9) = 2.46 > 1.5: that token is dropped, the others keep exp(d)
    want = [math.exp(x) if math.exp(x) <= cap else 0.0 for x in d]
    assert weights[mask > 0].tolist() == pytest.approx(want, rel=1e-6)
    assert want[3] == 0.0 and want[0] > 1.0  # not truncation: a weight above 1 but below the cap stays
    assert m["tis_clip_frac"] == pytest.approx(1 / 5, rel=1e-6)
    truncated, _ = _measured(trainer, rollout, mask, RC.Correction(mode="truncate", high=cap))
    assert truncated[1, 0].item() == pytest.approx(cap) and weights[1, 0].item() == 0.0


def test_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="clip"):
        RC.Correction(mode="clip", high=2.0)


# sample 0 was generated in two segments: its first token under an old version (behaviour log-prob
# -2.0, far below the trainer's -1.0: weight e^1 = 2.72 above the cap), its last under the newest
# (-1.05: weight e^0.05 = 1.05); sample 2 likewise with the weights the other way round
TWO_SEGMENTS = [[-2.0, -1.05], [-1.0], [-0.45, -1.6], [-1.0]]


def stale_samples() -> list[Sample]:
    out = samples()
    for s, r in zip(out, TWO_SEGMENTS, strict=True):
        s.rollout_logprobs = r
    return out


def hand_loss(cap: float, clip: float, mode: str) -> float:
    advs = grpo_advantages()
    total, tokens = 0.0, 0
    for i in range(4):
        for j, lp in enumerate(CURRENT[i]):
            w = math.exp(OLD[i][j] - TWO_SEGMENTS[i][j])
            w = min(w, cap) if mode == "truncate" else (w if w <= cap else 0.0)
            total += surrogate(lp, OLD[i][j], advs[i], clip) * w
            tokens += 1
    return total / tokens


@pytest.mark.parametrize("mode", ["truncate", "mask"])
def test_grpo_from_the_spec_weighs_each_segment_by_its_own_behaviour_logprobs(mode: str) -> None:
    cap = 1.5
    algo = make_algorithm(AlgorithmSpec.model_validate({"name": "grpo", "tisCap": cap, "tisMode": mode,
                                                        "klCoef": 0.0}))
    assert isinstance(algo, GRPO) and algo.tis_mode == mode
    batch = algo.prepare(stale_samples(), token_budget=8)
    loss, m = algo.loss(batch.scatter(CURRENT), batch)
    m = RC.summarize(m)
    assert loss.item() == pytest.approx(hand_loss(cap, algo.clip, mode), rel=1e-5)
    # the two modes differ exactly on the tokens above the cap (sample 0's first, sample 2's last)
    other = hand_loss(cap, algo.clip, "mask" if mode == "truncate" else "truncate")
    assert abs(loss.item() - other) > 1e-3
    d = [o - r for os_, rs in zip(OLD, TWO_SEGMENTS, strict=True) for o, r in zip(os_, rs, strict=True)]
    assert m["tis_clip_frac"] == pytest.approx(sum(math.exp(x) > cap for x in d) / len(d), rel=1e-5)
    assert m["tis_clip_frac"] == pytest.approx(2 / 6, rel=1e-5)


def test_tis_mode_defaults_to_truncate_and_rejects_others() -> None:
    algo = make_algorithm(AlgorithmSpec.model_validate({"name": "grpo", "tisCap": 2.0}))
    assert isinstance(algo, GRPO) and algo.tis_mode == "truncate"
    with pytest.raises(ValueError, match="tisMode"):
        AlgorithmSpec.model_validate({"name": "grpo", "tisCap": 2.0, "tisMode": "clip"})
