"""On-policy distillation (algorithm.distillation) and the policy metrics every step reports.

Distillation: the teacher's log-probs minus the student's on each of the student's own tokens, as a
per-token advantage term or summed into the reward, checked against hand computations; the spec's
rules, and the preflight refusing a teacher (or reference) whose shape the trainer's engine cannot
take. Metrics: clip fractions on each side, the ratio's spread and the entropy estimate on a batch
computed by hand."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import ValidationError

from tandem.sidecars.algorithms import GRPO, Sample, make_algorithm
from tandem.sidecars.algorithms import functional as F
from tandem.sidecars.algorithms.algorithm_interface import AlgorithmError
from tandem.spec import model_dir
from tandem.spec.algorithm import Algorithm


def spec(**fields: Any) -> Algorithm:
    return Algorithm.model_validate(fields)


def grpo(**fields: Any) -> GRPO:
    algo = make_algorithm(spec(**fields), max_tokens=8)
    assert isinstance(algo, GRPO)
    return algo


def samples() -> list[Sample]:
    """Two prompts of two completions; the teacher likes completion 0 more than the student does."""
    return [
        Sample([1], [2, 3], group=0, reward=1.0, old_logprobs=[-1.0, -2.0], teacher_logprobs=[-0.5, -1.0]),
        Sample([1], [4], group=0, reward=0.0, old_logprobs=[-0.2], teacher_logprobs=[-3.0]),
        Sample([5], [6, 7, 8], group=1, reward=0.0, old_logprobs=[-1.0] * 3, teacher_logprobs=[-1.0] * 3),
        Sample([5], [9], group=1, reward=0.0, old_logprobs=[-0.5], teacher_logprobs=[-0.25]),
    ]


def flat(rows: list[list[float]]) -> list[float]:
    return [x for row in rows for x in row]


def advantages(algo: GRPO, batch_samples: list[Sample]) -> tuple[list[list[float]], dict[str, float]]:
    batch = algo.prepare(batch_samples, 64)
    got = batch.unpack(batch.token_fields["advantages"])
    return [got[i].tolist() for i in sorted(got)], batch.stats


def test_pure_distillation_is_the_teachers_minus_the_students_log_prob_per_token() -> None:
    algo = grpo(klCoef=0.0, distillation={"teacher": "/t", "coef": 2.0, "taskReward": False})
    assert algo.needs_old_logprobs  # the student's own log-probs before the step
    adv, stats = advantages(algo, samples())
    assert [len(a) for a in adv] == [2, 1, 3, 1]
    assert flat(adv) == pytest.approx([1.0, 2.0, -5.6, 0.0, 0.0, 0.0, 0.5])
    # the reverse KL's estimate: mean over the 7 tokens of log pi_student - log pi_teacher
    assert stats["distill_reverse_kl"] == pytest.approx(-(0.5 + 1.0 - 2.8 + 0 + 0.25) / 7)


def test_distillation_beside_the_task_advantage() -> None:
    base, _ = advantages(grpo(klCoef=0.0), samples())
    both, _ = advantages(grpo(klCoef=0.0, distillation={"teacher": "/t", "coef": 0.5}), samples())
    teacher_minus_student = [[0.5, 1.0], [-2.8], [0.0] * 3, [0.25]]
    for b, got, d in zip(base, both, teacher_minus_student, strict=True):
        assert got == pytest.approx([x + 0.5 * y for x, y in zip(b, d, strict=True)])


def test_distillation_as_a_reward_goes_through_the_group_estimator() -> None:
    algo = grpo(klCoef=0.0, normStd=False, distillation={"teacher": "/t", "coef": 1.0, "form": "reward"})
    adv, _ = advantages(algo, samples())
    r = [1.0 + 1.5, 0.0 - 2.8, 0.0, 0.25]  # reward + the summed per-token term
    want = [r[0] - (r[0] + r[1]) / 2, r[1] - (r[0] + r[1]) / 2, r[2] - (r[2] + r[3]) / 2, r[3] - (r[2] + r[3]) / 2]
    assert flat(adv) == pytest.approx([want[0]] * 2 + [want[1]] + [want[2]] * 3 + [want[3]])


def test_distillation_without_teacher_log_probs_is_refused() -> None:
    bare = [Sample(s.prompt_ids, s.completion_ids, s.group, s.reward, old_logprobs=s.old_logprobs)
            for s in samples()]
    with pytest.raises(AlgorithmError, match="teacher_logprobs"):
        grpo(klCoef=0.0, distillation={"teacher": "/t"}).prepare(bare, 64)


def test_the_spec_keeps_distillation_to_grpo_and_shows_it() -> None:
    with pytest.raises(ValidationError, match="distillation"):
        spec(name="ppo", distillation={"teacher": "/t"})
    with pytest.raises(ValidationError, match="form"):
        spec(distillation={"teacher": "/t", "form": "sequence"})
    assert spec(distillation={"teacher": "/t", "taskReward": False}).summary().endswith(
        "distillation coef 1 in advantage (no task reward)")


def test_policy_metrics_by_hand() -> None:
    ratio = torch.tensor([[0.5, 1.5, 1.0, 0.7]])
    adv = torch.tensor([[-1.0, 1.0, 1.0, 1.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    logp = torch.tensor([[-1.0, -2.0, -3.0, -9.0]])
    m = F.policy_metrics(logp, ratio, adv, mask, 0.2, 0.28)
    assert m["clip_frac_low"] == pytest.approx(1 / 3)  # token 0: A < 0 and r < 0.8
    assert m["clip_frac_high"] == pytest.approx(1 / 3)  # token 1: A > 0 and r > 1.28 (token 3 is masked)
    assert m["ratio_std"] == pytest.approx(torch.tensor([0.5, 1.5, 1.0]).std(unbiased=False).item())
    assert m["entropy"] == pytest.approx(2.0)
    # cispo clips the weight whatever the advantage's sign
    cispo = F.policy_metrics(logp, ratio, -adv, mask, 0.2, 0.28, mode="cispo")
    assert (cispo["clip_frac_low"], cispo["clip_frac_high"]) == pytest.approx((1 / 3, 1 / 3))
    ppo_clip = F.policy_metrics(logp, ratio, -adv, mask, 0.2, 0.28)
    assert (ppo_clip["clip_frac_low"], ppo_clip["clip_frac_high"]) == (0.0, 0.0)  # the bounds do not bind


def test_grpo_loss_reports_the_policy_metrics() -> None:
    algo = grpo(klCoef=0.0)
    batch = algo.prepare(samples(), 64)
    logp = torch.full_like(batch.loss_mask, -1.0)
    _, metrics = algo.loss(logp, batch)
    assert {"clip_frac_low", "clip_frac_high", "ratio_std", "entropy"} <= set(metrics)
    assert metrics["entropy"] == pytest.approx(1.0)


def write_config(path: Path, **overrides: Any) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    config = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100, "tie_word_embeddings": True}
    (path / "config.json").write_text(json.dumps(config | overrides))
    return path


def test_a_teacher_of_another_shape_is_named_with_the_key_that_differs(tmp_path: Path) -> None:
    model = json.loads((write_config(tmp_path / "m") / "config.json").read_text())
    same = json.loads((write_config(tmp_path / "same") / "config.json").read_text())
    wider = json.loads((write_config(tmp_path / "wide", hidden_size=128) / "config.json").read_text())
    assert model_dir.shape_mismatch(model, same) is None
    assert model_dir.shape_mismatch(model, wider) == "config.json's hidden_size is 128 where the model has 64"
