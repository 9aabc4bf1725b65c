"""algorithm.preset and the algorithm menu end to end through the spec: what each preset expands to
(the job's own values winning, the CRD leaving those fields undefaulted so a stored job still gets
them), and GRPO configured from it preparing and scoring batches as the recipe says (Dr. GRPO's
normaliser, RLOO and REINFORCE++ with the KL in the rewards, DAPO's overlong shaping and truncation
mask, GSPO's and CISPO's losses summing over micro-batches like the whole batch)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tandem.sidecars.algorithms import GRPO, Sample, make_algorithm
from tandem.sidecars.algorithms import estimators as est
from tandem.spec import crd
from tandem.spec.algorithm import PRESETABLE, PRESETS, Algorithm


def spec(**fields: Any) -> Algorithm:
    return Algorithm.model_validate(fields)


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_each_preset_expands_and_the_jobs_own_values_win(preset: str) -> None:
    got = spec(preset=preset)
    for key, value in PRESETS[preset].items():
        have = getattr(got, key)
        assert (have.model_dump() if hasattr(have, "model_dump") else have) == (
            {"buffer": None, **value} if key == "overlong" else value), key
    mine = spec(preset=preset, klCoef=0.01, lossAgg="seq-mean-token-mean")
    assert mine.kl_coef == 0.01 and mine.loss_agg == "seq-mean-token-mean"
    assert mine.summary().startswith(f"grpo (preset {preset}): ")


def test_defaults_per_name_and_the_summary() -> None:
    assert (spec().advantage, spec().kl_estimator, spec().kl_penalty) == ("grpo", "k3", "loss")
    ppo = spec(name="ppo")
    assert (ppo.advantage, ppo.kl_estimator, ppo.kl_penalty) == ("gae", "k1", "reward")
    assert spec(preset="dapo").summary(max_tokens=100) == (
        "grpo (preset dapo): policyLoss clip, clip 0.2/0.28, advantage grpo, lossAgg token-mean, klCoef 0, "
        "overlong buffer 20 penalty 1, dynamic sampling 3 rounds")


def test_the_crd_leaves_preset_fields_to_the_preset() -> None:
    props = crd.spec_schema()["properties"]["algorithm"]["properties"]
    camel = {k: k.split("_")[0] + "".join(p.title() for p in k.split("_")[1:]) for k in PRESETABLE}
    assert not [k for k in PRESETABLE if "default" in props[camel[k]]]
    assert props["groupSize"]["default"] == 8  # other fields keep the API server's defaults
    defaulted = crd.spec_schema()["properties"]["algorithm"]["default"]
    stored = {**defaulted, "preset": "dr_grpo"}  # what the API server stores for `preset: dr_grpo`
    got = Algorithm.model_validate(stored)
    assert got.kl_coef == 0.0 and not got.norm_std and got.loss_agg == "seq-mean-token-sum-norm"


def samples(truncated_last: bool = False) -> list[Sample]:
    return [
        Sample([1, 2], [3, 4, 5], group=0, reward=1.0, ref_logprobs=[-1.0] * 3, old_logprobs=[-0.5] * 3),
        Sample([1, 2], [6], group=0, reward=0.0, ref_logprobs=[-2.0], old_logprobs=[-2.0]),
        Sample([7], [8, 9], group=1, reward=0.0, ref_logprobs=[-1.0] * 2, old_logprobs=[-1.0] * 2),
        Sample([7], [8, 9, 9, 9], group=1, reward=1.0, ref_logprobs=[-1.0] * 4, old_logprobs=[-0.8] * 4,
               truncated=truncated_last),
    ]


def grpo(max_tokens: int = 4, **fields: Any) -> GRPO:
    algo = make_algorithm(spec(**fields), max_tokens=max_tokens)
    assert isinstance(algo, GRPO)
    return algo


def per_sample(batch: Any, values: torch.Tensor) -> list[list[float]]:
    """A packed per-token tensor as one list per sample, in sample order."""
    got = batch.unpack(values)
    return [got[i].tolist() for i in sorted(got)]


def advantages(algo: GRPO, batch_samples: list[Sample]) -> list[list[float]]:
    batch = algo.prepare(batch_samples, 64)
    return per_sample(batch, batch.token_fields["advantages"])


def test_dr_grpo_neither_divides_by_std_nor_by_length() -> None:
    algo = grpo(preset="dr_grpo")
    batch = algo.prepare(samples(), 64)
    adv = per_sample(batch, batch.token_fields["advantages"])
    assert adv == [[0.5] * 3, [-0.5], [-0.5] * 2, [0.5] * 4]
    assert batch.weights is not None
    on = batch.weights[batch.loss_mask > 0]
    assert on.tolist() == pytest.approx([1 / (4 * 4)] * 10)  # 4 sequences x maxTokens 4, every token alike
    assert algo.needs_reference is False


def test_rloo_takes_the_kl_from_the_rewards_before_the_leave_one_out_baseline() -> None:
    algo = grpo(preset="rloo", klCoef=0.1)
    assert algo.needs_old_logprobs and algo.needs_reference
    batch_samples = samples()
    adv = advantages(algo, batch_samples)
    kl = [sum(s.old_logprobs[t] - s.ref_logprobs[t] for t in range(len(s.completion_ids)))  # type: ignore[index]
          for s in batch_samples]
    r = torch.tensor([s.reward - 0.1 * k for s, k in zip(batch_samples, kl, strict=True)])
    want = est.outcome_advantages("rloo", r, [0, 0, 1, 1])
    assert [a[0] for a in adv] == pytest.approx(want.tolist())
    assert "ref_logprobs" not in algo.prepare(batch_samples, 64).token_fields  # no KL term in the loss


def test_reinforce_pp_gives_per_token_returns_whitened_over_the_batch() -> None:
    algo = grpo(preset="reinforce_pp", klCoef=0.0, gamma=0.5)
    adv = advantages(algo, samples())
    flat = torch.tensor([a for row in adv for a in row])
    assert float(flat.mean()) == pytest.approx(0.0, abs=1e-6) and float(flat.pow(2).mean()) == pytest.approx(1.0, 1e-4)
    assert adv[0][0] < adv[0][1] < adv[0][2]  # the score discounted back from the last token
    base = advantages(grpo(advantage="reinforce_pp_baseline", klCoef=0.0, gamma=1.0), samples())
    assert base[1][0] < 0 < base[0][0]  # centred on the group mean before whitening


def test_dapo_shapes_overlong_completions_and_can_mask_truncated_ones() -> None:
    algo = grpo(max_tokens=4, preset="dapo", overlong={"buffer": 2})
    assert algo.overlong_buffer == 2 and algo.clip_high == 0.28 and algo.kl_coef == 0.0
    rewards, stats = algo.scores(samples())
    assert rewards.tolist() == pytest.approx([1.0 - 0.5, 0.0, 0.0, 1.0 - 1.0])  # lengths 3 and 4 of at most 4
    assert stats["overlong_penalty_mean"] == pytest.approx(-1.5 / 4)
    assert grpo(preset="dapo").overlong_buffer == 0  # maxTokens 4 // 5
    masked = grpo(max_tokens=100, maskTruncated=True).prepare(samples(truncated_last=True), 64)
    assert [sum(v) for v in per_sample(masked, masked.loss_mask)] == [3.0, 1.0, 2.0, 0.0]
    assert masked.stats["truncated_frac"] == 0.25


@pytest.mark.parametrize("fields", [{"preset": "gspo"}, {"preset": "cispo"}, {"preset": "dr_grpo"},
                                    {"lossAgg": "seq-mean-token-sum", "clipC": 3.0}])
def test_micro_batch_losses_add_up_to_the_whole_batch(fields: dict[str, Any]) -> None:
    algo = grpo(**{"klCoef": 0.0, **fields})
    batch = algo.prepare(samples(), 8)  # rows of 8 tokens: several rows
    torch.manual_seed(0)
    logprobs = -torch.rand(batch.labels.shape)
    whole, _ = algo.loss(logprobs, batch)
    parts = sum(float(algo.loss(logprobs[p0:p0 + p.num_rows], p)[0])
                for p, p0 in zip(batch.split(batch.num_rows), range(batch.num_rows), strict=True))
    assert batch.num_rows > 1 and parts == pytest.approx(float(whole), rel=1e-5)
