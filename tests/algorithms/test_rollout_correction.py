"""Importance sampling beyond the token (algorithm.rolloutCorrection): token and sequence level, truncated,
masked and IcePop's band, against values computed here by hand; the gradients torch's autograd gives
the GRPO and PPO losses under each; and the batch's metrics (mismatch_kl, ESS, clipped and masked shares),
exact however the batch is split into micro-batches.
"""

from __future__ import annotations

import math

import pytest
import torch

from tandem.sidecars.algorithms import GRPO, PPO, Sample, make_algorithm
from tandem.sidecars.algorithms import rollout_correction as RC
from tandem.spec.models import Algorithm as AlgorithmSpec

# Two rows: row 0 holds sequence 0 (cols 0-1) and sequence 1 (col 2), col 3 is padding (a huge gap there
# must count nowhere); row 1 holds sequence 2 (cols 0-1). d = log p_trainer - log p_rollout per token.
TRAINER = torch.tensor([[-1.0, -0.5, -2.0, 5.0], [-0.1, -3.0, 0.0, 0.0]])
ROLLOUT = torch.tensor([[-1.2, -0.5, -1.0, -30.0], [-1.0, -1.0, 0.0, 0.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
SEQ = torch.tensor([[0, 0, 1, -1], [2, 2, -1, -1]])
D = [0.2, 0.0, -1.0, 0.9, -2.0]  # the masked tokens' d, in order
SEQ_OF = [0, 0, 1, 2, 2]


def run(c: RC.Correction | None) -> tuple[list[float], dict[str, float]]:
    w, stats = RC.weights(TRAINER, ROLLOUT, MASK, SEQ, c)
    return w[MASK > 0].tolist(), RC.summarize(stats)


def ess(ws: list[float]) -> float:
    squares = sum(x * x for x in ws)
    return sum(ws) ** 2 / (len(ws) * squares) if squares else 0.0


def test_measures_without_a_correction() -> None:
    w, m = run(None)
    assert w == [1.0] * 5
    rho = [math.exp(x) for x in D]
    assert m["mismatch_kl"] == pytest.approx(sum(r - 1 - x for r, x in zip(rho, D, strict=True)) / 5, rel=1e-6)
    assert m["mismatch_ess"] == pytest.approx(ess(rho), rel=1e-6)
    assert m["mismatch_mean"] == pytest.approx(sum(abs(x) for x in D) / 5, rel=1e-6)
    assert not any(k.startswith(("rc_", "is_", "tis_")) for k in m)  # measurement only


def test_agreeing_engines_measure_zero_kl_and_full_ess() -> None:
    w, stats = RC.weights(TRAINER, TRAINER.clone(), MASK, SEQ, RC.Correction(level="sequence"))
    m = RC.summarize(stats)
    assert m["mismatch_kl"] == 0.0 and m["mismatch_ess"] == pytest.approx(1.0) and m["is_ess"] == pytest.approx(1.0)
    assert m["is_token_clipped_frac"] == 0.0 and m["is_seq_masked_frac"] == 0.0


@pytest.mark.parametrize("mode", ["truncate", "mask", "icepop"])
def test_token_level_by_hand(mode: str) -> None:
    low, high = (0.5, 2.0) if mode != "truncate" else (0.0, 2.0)
    w, m = run(RC.Correction(level="token", mode=mode, low=low, high=high))
    rho = [math.exp(x) for x in D]  # 1.22, 1, 0.37, 2.46, 0.14
    if mode == "truncate":
        want = [min(r, high) for r in rho]
        assert m["is_token_clipped_frac"] == pytest.approx(1 / 5) and m["is_token_masked_frac"] == 0.0
        assert m["is_seq_clipped_frac"] == pytest.approx(1 / 3)  # sequence 2's first token
    else:  # rho 0.37 and 0.14 below the band, 2.46 above: masked; the others keep rho (not truncated)
        want = [r if low <= r <= high else 0.0 for r in rho]
        assert want == [rho[0], 1.0, 0.0, 0.0, 0.0]
        assert m["is_token_masked_frac"] == pytest.approx(3 / 5) and m["is_token_clipped_frac"] == 0.0
        assert m["is_seq_masked_frac"] == pytest.approx(2 / 3)  # sequences 1 and 2 lose a token
    assert w == pytest.approx(want, rel=1e-6)
    assert m["is_ess"] == pytest.approx(ess(want), rel=1e-6)
    assert m["tis_clip_frac"] == pytest.approx(1 / 5)  # tokens above high, as tisCap reported it


@pytest.mark.parametrize("aggregate", ["product", "geometric"])
@pytest.mark.parametrize("mode", ["truncate", "mask"])
def test_sequence_level_by_hand(aggregate: str, mode: str) -> None:
    low, high = (0.4, 1.25) if mode == "mask" else (0.0, 1.2)
    w, m = run(RC.Correction(level="sequence", mode=mode, aggregate=aggregate, low=low, high=high))
    logs = [0.2, -1.0, 0.9 - 2.0]  # per sequence, the sum of its tokens' d
    if aggregate == "geometric":
        logs = [0.2 / 2, -1.0, (0.9 - 2.0) / 2]
    seq_rho = [math.exp(x) for x in logs]  # product 1.22, 0.37, 0.33; geometric 1.105, 0.37, 0.58
    if mode == "truncate":
        per_seq = [min(r, high) for r in seq_rho]
    else:
        per_seq = [r if low <= r <= high else 0.0 for r in seq_rho]
    want = [per_seq[s] for s in SEQ_OF]
    assert w == pytest.approx(want, rel=1e-6)
    assert m["is_ess"] == pytest.approx(ess(want), rel=1e-6)
    clipped = [r > high for r in seq_rho] if mode == "truncate" else [False] * 3
    masked = [not (low <= r <= high) for r in seq_rho] if mode == "mask" else [False] * 3
    assert m["is_seq_clipped_frac"] == pytest.approx(sum(clipped) / 3)
    assert m["is_seq_masked_frac"] == pytest.approx(sum(masked) / 3)
    assert m["is_token_masked_frac"] == pytest.approx(sum(masked[s] for s in SEQ_OF) / 5)
    if mode == "mask":  # whole sequences leave (product: 1 and 2, geometric: 1), the rest keep rho
        assert masked == ([False, True, True] if aggregate == "product" else [False, True, False])
        assert (w[3] == 0.0) == (w[4] == 0.0) and w[0] == w[1] > 0
    else:
        assert clipped == ([True, False, False] if aggregate == "product" else [False] * 3)
    assert "tis_clip_frac" not in m
    # the mismatch measures are the tokens' whatever the level
    assert m["mismatch_ess"] == pytest.approx(ess([math.exp(x) for x in D]), rel=1e-6)


def test_product_and_geometric_differ_and_the_product_compounds() -> None:
    _, m_prod = run(RC.Correction(level="sequence", aggregate="product", high=1.0))
    w_geo, _ = run(RC.Correction(level="sequence", aggregate="geometric", high=1.0))
    w_prod, _ = run(RC.Correction(level="sequence", aggregate="product", high=1.0))
    assert w_prod[3] == pytest.approx(math.exp(-1.1)) and w_geo[3] == pytest.approx(math.exp(-0.55))
    assert m_prod["is_seq_clipped_frac"] == pytest.approx(1 / 3)


def test_summaries_are_exact_over_micro_batches() -> None:
    """The engines average each metric over micro-batches: the sums' ratios are the whole batch's."""
    c = RC.Correction(level="sequence", mode="mask", low=0.4, high=1.25)
    _, whole = RC.weights(TRAINER, ROLLOUT, MASK, SEQ, c)
    parts = [RC.weights(TRAINER[i:i + 1], ROLLOUT[i:i + 1], MASK[i:i + 1], SEQ[i:i + 1], c)[1] for i in range(2)]
    averaged = {k: (parts[0][k] + parts[1][k]) / 2 for k in parts[0] if k.startswith("rc_")}
    want, got = RC.summarize(whole), RC.summarize(averaged)
    for key in ("mismatch_kl", "mismatch_ess", "is_ess", "is_token_masked_frac", "is_seq_masked_frac"):
        assert got[key] == pytest.approx(want[key], rel=1e-9), key
    # the mean of the two micro-batches' own ESS is not the batch's: why the sums travel
    own = [RC.summarize(p)["is_ess"] for p in parts]
    assert abs(sum(own) / 2 - want["is_ess"]) > 1e-3


# ---- the losses and their gradients ---------------------------------------------------------------

ROLL = [[-1.0, -0.3, -0.2], [-2.5], [-0.1, -0.1], [-3.0, -0.4]]
CURRENT = [[-0.9, -1.3, -0.6], [-1.0], [-0.5, -0.2], [-1.1, -0.5]]
REWARDS = [1.0, 0.0, 0.0, 1.0]


def samples() -> list[Sample]:
    return [Sample([1, 2] if i < 2 else [6], [3 + j for j in range(len(ROLL[i]))], group=i // 2, reward=REWARDS[i],
                   rollout_logprobs=ROLL[i]) for i in range(4)]


def hand_weights(c: RC.Correction) -> list[list[float]]:
    """Each completion token's weight against CURRENT (the trainer's log-probs: on-policy, no old ones)."""
    out = []
    for cur, roll in zip(CURRENT, ROLL, strict=True):
        d = [a - b for a, b in zip(cur, roll, strict=True)]
        if c.level == "token":
            rho = [math.exp(x) for x in d]
        else:
            s = sum(d) / (len(d) if c.aggregate == "geometric" else 1)
            rho = [math.exp(s)] * len(d)
        if c.mode == "truncate":
            out.append([min(r, c.high) for r in rho])
        else:
            out.append([r if c.low <= r <= c.high else 0.0 for r in rho])
    return out


CORRECTIONS = [RC.Correction(level="token", mode="truncate", high=1.5),
               RC.Correction(level="token", mode="icepop", low=0.5, high=5.0),
               RC.Correction(level="token", mode="mask", low=0.0, high=1.5),
               RC.Correction(level="sequence", mode="truncate", aggregate="product", high=2.0),
               RC.Correction(level="sequence", mode="mask", aggregate="geometric", low=0.6, high=1.5)]


@pytest.mark.parametrize("c", CORRECTIONS, ids=lambda c: f"{c.level}-{c.mode}-{c.aggregate}")
def test_grpo_gradient_is_the_weight_times_the_advantage(c: RC.Correction) -> None:
    """On-policy (ratio 1, inside the clip), d loss / d log pi_t = -A_t w_t / tokens under token-mean."""
    algo = GRPO(kl_coef=0.0, correction=c)
    batch = algo.prepare(samples(), token_budget=16)
    lp = batch.scatter(CURRENT).requires_grad_(True)
    loss, _ = algo.loss(lp, batch)
    loss.backward()
    assert lp.grad is not None
    a = 0.5 / math.sqrt(0.5)
    adv = [a, -a, -a, a]
    w = hand_weights(c)
    grads = batch.unpack(lp.grad)
    tokens = sum(len(x) for x in CURRENT)
    for i in range(4):
        want = [-adv[i] * wt / tokens for wt in w[i]]
        assert grads[i].tolist() == pytest.approx(want, rel=1e-5, abs=1e-9), (i, w[i])
    assert loss.item() == pytest.approx(sum(-adv[i] * wt for i in range(4) for wt in w[i]) / tokens, rel=1e-5)
    if c.mode != "truncate":  # something is masked in each mask case, and its gradient is exactly 0
        assert any(wt == 0.0 for ws in w for wt in ws)


def test_ppo_takes_the_same_weights() -> None:
    c = RC.Correction(level="sequence", mode="truncate", aggregate="geometric", high=1.1)
    algo = PPO(kl_coef=0.0, gamma=1.0, lam=1.0, whiten=False, correction=c)
    for s, cur in zip(batch_samples := samples(), CURRENT, strict=True):
        s.old_logprobs = cur
    batch = algo.prepare(batch_samples, token_budget=16)
    lp = batch.scatter(CURRENT).requires_grad_(True)
    loss, m = algo.loss(lp, batch)
    loss.backward()
    assert lp.grad is not None
    w = hand_weights(c)
    adv = [r - 0.5 for r in REWARDS]  # group baseline, gamma = lam = 1
    tokens = sum(len(x) for x in CURRENT)
    grads = batch.unpack(lp.grad)
    for i in range(4):
        assert grads[i].tolist() == pytest.approx([-adv[i] * wt / tokens for wt in w[i]], rel=1e-5)
    assert "rc_w" in m and RC.summarize(m)["is_seq_clipped_frac"] > 0


def test_the_spec_builds_the_correction_and_tis_cap_stays_its_token_shorthand() -> None:
    spec = AlgorithmSpec.model_validate({"rolloutCorrection": {"level": "sequence", "aggregate": "geometric",
                                                               "mode": "mask", "low": 0.2, "high": 3.0}})
    algo = make_algorithm(spec)
    assert isinstance(algo, GRPO)
    assert algo.correction == RC.Correction(level="sequence", mode="mask", aggregate="geometric", low=0.2, high=3.0)
    icepop = make_algorithm(AlgorithmSpec.model_validate({"name": "ppo", "rolloutCorrection": {"mode": "icepop"}}))
    assert isinstance(icepop, PPO) and icepop.correction == RC.Correction(mode="icepop", low=0.5, high=5.0)
    tis = AlgorithmSpec.model_validate({"tisCap": 3.0, "tisMode": "mask"})
    assert tis.correction is not None and tis.correction.bounds == (0.0, 3.0) and tis.correction.mode == "mask"
    grpo = make_algorithm(tis)
    assert isinstance(grpo, GRPO) and RC.Correction.of(grpo.correction, grpo.tis_cap, grpo.tis_mode) == RC.Correction(
        mode="mask", high=3.0)
    assert AlgorithmSpec.model_validate({"rolloutCorrection": {}}).correction.bounds == (0.0, 2.0)  # type: ignore[union-attr]


@pytest.mark.parametrize(("bad", "words"), [
    ({"rolloutCorrection": {"low": 0.5}}, "low: applies to modes mask and icepop"),
    ({"rolloutCorrection": {"mode": "icepop", "level": "sequence"}}, "level: icepop masks tokens"),
    ({"rolloutCorrection": {"aggregate": "geometric"}}, "aggregate: applies to level sequence"),
    ({"rolloutCorrection": {"mode": "mask", "low": 1.0}}, "less than 1"),
    ({"rolloutCorrection": {"high": 0.5}}, "greater than or equal to 1"),
    ({"rolloutCorrection": {}, "tisCap": 2.0}, "rolloutCorrection: tisCap (with tisMode) is rolloutCorrection's"),
    ({"name": "dpo", "rolloutCorrection": {}}, "rolloutCorrection: applies to grpo and ppo"),
])
def test_the_spec_refuses_what_does_not_apply(bad: dict[str, object], words: str) -> None:
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        AlgorithmSpec.model_validate(bad)
