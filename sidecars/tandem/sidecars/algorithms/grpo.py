"""GRPO and its family: group-relative (or leave-one-out, or REINFORCE++) advantages, a clipped
policy loss (PPO's, GSPO's or CISPO's), a KL to the reference in the loss or in the rewards.

Role: `GRPO.prepare` turns each prompt's group of scored completions into per-token advantages
(`algorithm.advantage`, `estimators`): by default the sample's group-normalised reward on every
completion token; DAPO's overlong shaping adds to the rewards first, and `maskTruncated` takes
completions cut at the generation limit out of the loss. `GRPO.loss` is the policy loss
(`algorithm.policyLoss`, `functional.policy_loss`) plus, with `klPenalty: loss`, `kl_coef` x the
chosen KL estimator per token (k3 by default), aggregated by `algorithm.lossAgg`. On-policy
distillation (`algorithm.distillation`) adds coef x (log pi_teacher - log pi_student) to each token's
advantage, or its sum to the reward before the estimator. When the samples
carry the rollout engine's own log-probs, the loss reports the rollout/trainer mismatch and, with a
correction (`algorithm.rolloutCorrection`, or `tis_cap`/`tis_mode` at token level), weighs each token by
its importance weight against p_rollout (`rollout_correction.weights`). With an environment, the KL
in the rewards, REINFORCE++'s returns and whitening and the distillation term count only the model's
tokens (`algorithm_interface.model_tokens`). The presets (dapo, dr_grpo, gspo, rloo, reinforce_pp, cispo) are spec-level
(`tandem.spec.algorithms`). Callers: the driver via `make_algorithm`, the trainer engine via `loss`.

Aggregation default: token-mean — the loss is the mean over all completion tokens of the batch (each
token weighs the same, as in DAPO), which does not favour short completions the way the
per-sequence mean (seq-mean-token-mean, the original GRPO) does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from tandem.sidecars.algorithms import estimators as est
from tandem.sidecars.algorithms import functional as F
from tandem.sidecars.algorithms import rollout_correction as RC
from tandem.sidecars.algorithms.algorithm_interface import (
    AlgorithmError,
    Metrics,
    Sample,
    last_model_token,
    model_tokens,
    pack_samples,
    per_token,
)
from tandem.sidecars.algorithms.packing import PackedBatch
from tandem.sidecars.algorithms.policy_gradient import policy_terms

if TYPE_CHECKING:
    from tandem.spec.models import Algorithm as AlgorithmSpec


@dataclass
class GRPO:
    clip: float = 0.2  # algorithm.clipLow (or clip)
    kl_coef: float = 0.001
    scale_advantages: bool = True  # divide by the group std (False: Dr. GRPO); algorithm.normStd
    reduction: F.Reduction | F.LossAgg = "token"  # algorithm.lossAgg
    clip_high: float | None = None  # asymmetric upper clip (DAPO "clip-higher"); None: = clip
    pad_id: int = 0
    tis_cap: float | None = None  # truncated importance sampling against the rollout's log-probs
    tis_mode: str = "truncate"  # or "mask": drop the tokens whose weight exceeds tis_cap
    correction: RC.Correction | None = None  # algorithm.rolloutCorrection (tis_cap/tis_mode: its token level)
    share_prompts: bool = False  # a group's prompt packed once per row (packing.py)
    policy_loss: F.PolicyLoss = "clip"  # clip (PPO's), gspo, cispo
    clip_c: float | None = None  # dual-clip bound on negative-advantage tokens
    advantage: str = "grpo"  # grpo, rloo, reinforce_pp, reinforce_pp_baseline (estimators.py)
    gamma: float = 1.0  # REINFORCE++'s discount
    kl_estimator: est.KLEstimator = "k3"
    kl_penalty: str = "loss"  # "loss": kl_coef x KL in the loss; "reward": subtracted from the rewards
    agg_norm: float | None = None  # seq-mean-token-sum-norm's divisor (default: max_tokens)
    max_tokens: int | None = None  # the rollout's generation limit (overlong shaping, truncation)
    overlong_buffer: int = 0  # DAPO's soft overlong punishment inside this many tokens before max_tokens
    overlong_penalty: float = 1.0
    mask_truncated: bool = False  # completions cut at max_tokens leave the loss
    distill_coef: float = 0.0  # on-policy distillation's weight (algorithm.distillation); 0: none
    distill_form: str = "advantage"  # "advantage": per token; "reward": summed into the sample's reward
    task_reward: bool = True  # with distillation: keep the rewards' advantage beside its term

    @classmethod
    def from_spec(cls, spec: AlgorithmSpec, *, pad_id: int = 0, share_prompts: bool = False,
                  max_tokens: int | None = None) -> GRPO:
        return cls(clip=spec.clip_low_value, kl_coef=spec.kl_coef, pad_id=pad_id, tis_cap=spec.tis_cap,
                   correction=RC.Correction.from_spec(spec.rollout_correction),
                   tis_mode=spec.tis_mode, share_prompts=share_prompts, scale_advantages=spec.norm_std,
                   reduction=spec.loss_agg, clip_high=spec.clip_high_value, policy_loss=spec.policy_loss,
                   clip_c=spec.clip_c, advantage=spec.advantage or "grpo", gamma=spec.gamma,
                   kl_estimator=spec.kl_estimator or "k3", kl_penalty=spec.kl_penalty or "loss",
                   agg_norm=spec.loss_agg_norm, max_tokens=max_tokens,
                   overlong_buffer=(spec.overlong.buffer or (max_tokens or 0) // 5) if spec.overlong else 0,
                   overlong_penalty=spec.overlong.penalty if spec.overlong else 1.0,
                   mask_truncated=spec.mask_truncated,
                   distill_coef=spec.distillation.coef if spec.distillation else 0.0,
                   distill_form=spec.distillation.form if spec.distillation else "advantage",
                   task_reward=spec.distillation.task_reward if spec.distillation else True)

    @property
    def name(self) -> str:
        return "grpo"

    @property
    def needs_reference(self) -> bool:
        return self.kl_coef > 0

    @property
    def needs_old_logprobs(self) -> bool:
        # the sampling policy's KL to the reference, or the student's log-probs beside the teacher's
        return (self.kl_coef > 0 and self.kl_penalty == "reward") or self.distill_coef > 0

    @property
    def needs_values(self) -> bool:
        return False

    def scores(self, samples: Sequence[Sample]) -> tuple[torch.Tensor, Metrics]:
        """Each sample's reward with DAPO's overlong shaping added (when `overlong_buffer`)."""
        rewards = torch.tensor([s.reward for s in samples], dtype=torch.float32)
        if not self.overlong_buffer or self.max_tokens is None:
            return rewards, {}
        shaping = torch.tensor([est.overlong_penalty(len(s.completion_ids), self.max_tokens, self.overlong_buffer,
                                                     self.overlong_penalty) for s in samples])
        return rewards + shaping, {"overlong_penalty_mean": float(shaping.mean()) if shaping.numel() else 0.0}

    def truncated(self, s: Sample) -> bool:
        if s.truncated is not None:
            return s.truncated
        return self.max_tokens is not None and len(s.completion_ids) >= self.max_tokens

    def prepare(self, samples: Sequence[Sample], token_budget: int) -> PackedBatch:
        batch = pack_samples(samples, token_budget, pad_id=self.pad_id, share_prompts=self.share_prompts)
        rewards, stats = self.scores(samples)
        groups = [s.group for s in samples]
        ref = per_token(samples, "ref_logprobs")
        if self.needs_reference and ref is None:
            raise AlgorithmError("grpo with kl_coef > 0 needs ref_logprobs on every sample")
        model = model_tokens(samples)
        kl_tokens = self._reward_kl(samples, ref, model)
        n_model = max(sum(sum(m) for m in model), 1.0)
        if kl_tokens is not None:
            stats["kl_reward"] = sum(sum(k) for k in kl_tokens) / n_model
        distill = self._distillation(samples, model)
        if distill is not None:
            stats["distill_reverse_kl"] = -sum(sum(d) for d in distill) / n_model
            task = rewards if self.task_reward else torch.zeros_like(rewards)
            if self.distill_form == "reward":
                rewards = task + self.distill_coef * torch.tensor([sum(d) for d in distill])
            else:
                rewards = task
        per_sample = self._advantages(samples, rewards, groups, kl_tokens, model)
        if distill is not None and self.distill_form == "advantage":
            per_sample = [[a + self.distill_coef * d for a, d in zip(adv, dist, strict=True)]
                          for adv, dist in zip(per_sample, distill, strict=True)]
        batch.token_fields["advantages"] = batch.scatter(per_sample)
        for name in ("old_logprobs", "rollout_logprobs"):
            values = per_token(samples, name)
            if values is not None:
                batch.token_fields[name] = batch.scatter(values)
        if self.needs_reference and ref is not None and self.kl_penalty == "loss":
            batch.token_fields["ref_logprobs"] = batch.scatter(ref)
        cut = [self.truncated(s) for s in samples]
        if self.mask_truncated:  # their tokens leave the loss and its normaliser
            batch.loss_mask = batch.loss_mask * batch.scatter([[0.0 if c else 1.0] * len(s.completion_ids)
                                                               for c, s in zip(cut, samples, strict=True)])
        batch.weights = F.loss_weights(batch.loss_mask, batch.seq_index, self.reduction,
                                       norm=self.agg_norm or self.max_tokens)
        adv = torch.tensor([a[0] if a else 0.0 for a in per_sample])
        batch.stats.update(_group_stats(rewards, groups, adv, samples))
        batch.stats.update(stats, truncated_frac=sum(cut) / max(len(cut), 1))
        return batch

    def _reward_kl(self, samples: Sequence[Sample], ref: list[list[float]] | None,
                   model: list[list[float]]) -> list[list[float]] | None:
        """Per-token KL of the sampling policy to the reference, when it is a reward penalty: on the
        model's tokens only (0 on an environment's, which the policy did not choose)."""
        if not (self.kl_coef > 0 and self.kl_penalty == "reward"):
            return None
        old = per_token(samples, "old_logprobs") or per_token(samples, "rollout_logprobs")
        if old is None or ref is None:
            raise AlgorithmError("klPenalty reward needs old_logprobs (or the rollout's) and ref_logprobs")
        return [(est.kl(self.kl_estimator, torch.tensor(o), torch.tensor(r)) * torch.tensor(m)).tolist()
                for o, r, m in zip(old, ref, model, strict=True)]

    def _distillation(self, samples: Sequence[Sample], model: list[list[float]]) -> list[list[float]] | None:
        """Per token, log pi_teacher - log pi_student: the negative reverse KL's sample estimate (the
        student's log-probs: the trainer's before this step, else the rollout's); 0 on an environment's tokens."""
        if self.distill_coef <= 0:
            return None
        teacher = per_token(samples, "teacher_logprobs")
        student = per_token(samples, "old_logprobs") or per_token(samples, "rollout_logprobs")
        if teacher is None or student is None:
            raise AlgorithmError("on-policy distillation needs teacher_logprobs and old_logprobs (or the "
                                 "rollout's) on every sample")
        return [[(t - p) * k for t, p, k in zip(ts, ps, ms, strict=True)]
                for ts, ps, ms in zip(teacher, student, model, strict=True)]

    def _advantages(self, samples: Sequence[Sample], rewards: torch.Tensor, groups: list[int],
                    kl_tokens: list[list[float]] | None, model: list[list[float]]) -> list[list[float]]:
        lengths = [len(s.completion_ids) for s in samples]
        if self.advantage in est.OUTCOME:  # one value per sample, on each of its tokens
            if kl_tokens is not None:
                rewards = rewards - self.kl_coef * torch.tensor([sum(k) for k in kl_tokens])
            adv = est.outcome_advantages(self.advantage, rewards, groups, norm_std=self.scale_advantages)
            return [[float(a)] * n for a, n in zip(adv.tolist(), lengths, strict=True)]
        if self.advantage not in ("reinforce_pp", "reinforce_pp_baseline"):
            raise AlgorithmError(f"algorithm.advantage: {self.advantage!r} is not an advantage of grpo")
        score = est.group_centred(rewards, groups) if self.advantage == "reinforce_pp_baseline" else rewards
        width = max(lengths, default=0)
        tokens = torch.zeros(len(samples), width)
        mask = torch.zeros(len(samples), width)
        for i, n in enumerate(lengths):  # returns and whitening over the model's tokens only
            mask[i, :n] = torch.tensor(model[i])
            if kl_tokens is not None and n:
                tokens[i, :n] = -self.kl_coef * torch.tensor(kl_tokens[i])
            if n:
                tokens[i, last_model_token(model[i])] += score[i]
        adv = est.reinforce_pp(tokens, mask, self.gamma)
        return [adv[i, :n].tolist() for i, n in enumerate(lengths)]

    def loss(self, logprobs: torch.Tensor, batch: PackedBatch) -> tuple[torch.Tensor, Metrics]:
        if batch.weights is None:
            raise AlgorithmError("batch was not prepared by GRPO.prepare (no weights)")
        batch = batch.to(logprobs.device)
        terms = policy_terms(self, logprobs, batch)
        mask = terms.mask
        metrics: Metrics = dict(terms.mismatch)
        per_tok = terms.pg
        if self.kl_coef > 0 and self.kl_penalty == "loss":
            (ref,) = F.masked_inputs(mask, batch.token_fields["ref_logprobs"])
            kl = est.kl(self.kl_estimator, terms.logprobs, ref)
            per_tok = terms.pg + self.kl_coef * kl
            metrics["kl"] = float(F.masked_mean(kl.detach(), mask))
        loss = torch.where(mask > 0, per_tok * batch.weights, 0.0).sum()
        metrics.update(terms.metrics(loss))
        return loss, metrics


def _group_stats(
    rewards: torch.Tensor, groups: Sequence[int], adv: torch.Tensor, samples: Sequence[Sample]
) -> Metrics:
    ids = torch.as_tensor(list(groups))
    flat = 0
    uniq = torch.unique(ids).tolist()
    for g in uniq:
        r = rewards[ids == g]
        flat += int(bool((r == r[0]).all()))
    return {
        "reward_mean": float(rewards.mean()) if rewards.numel() else 0.0,
        "reward_std": float(rewards.std()) if rewards.numel() > 1 else 0.0,
        "advantage_abs_mean": float(adv.abs().mean()) if adv.numel() else 0.0,
        "flat_group_frac": flat / max(len(uniq), 1),  # groups with no signal (all rewards equal)
        "completion_len_mean": sum(len(s.completion_ids) for s in samples) / max(len(samples), 1),
        "completion_len_max": float(max((len(s.completion_ids) for s in samples), default=0)),
    }
