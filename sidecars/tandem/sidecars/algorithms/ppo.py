"""PPO: per-token rewards with a KL penalty, GAE, clipped policy loss, optional clipped critic loss.

Role: `PPO.prepare` builds per-token rewards (the sample's score on its last completion token,
minus `kl_coef` x the KL estimate of (old, ref) on every token when a reference is used: k1 = old - ref
by default, `algorithm.klEstimator`), runs GAE (gamma, lambda)
per sample over the completion tokens, whitens the advantages over the batch, and packs them;
`PPO.loss` is the policy loss (`algorithm.policyLoss`: PPO's clip, with clipHigh and dual-clip
clipC, or GSPO's or CISPO's), aggregated by `algorithm.lossAgg`; `PPO.critic_loss` the clipped value loss for the
critic model. Without a critic (`critic: false`) the value of every step is the mean score of the sample's group (a
group baseline). With an environment the KL penalty, the score's token, GAE and the whitening are the model's
tokens' only (`algorithm_interface.model_tokens`); the importance weights against the rollout's
log-probs are `rollout_correction.weights`. Callers: the driver via `make_algorithm`, the trainer engine.
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
class PPO:
    clip: float = 0.2
    kl_coef: float = 0.001
    gamma: float = 1.0
    lam: float = 0.95
    critic: bool = False
    value_clip: float = 0.2
    whiten: bool = True
    reduction: F.Reduction | F.LossAgg = "token"
    pad_id: int = 0
    tis_cap: float | None = None  # truncated importance sampling against the rollout's log-probs
    tis_mode: str = "truncate"  # or "mask": drop the tokens whose weight exceeds tis_cap
    correction: RC.Correction | None = None  # algorithm.rolloutCorrection (tis_cap/tis_mode: its token level)
    share_prompts: bool = False  # a group's prompt packed once per row (packing.py)
    clip_high: float | None = None  # asymmetric upper clip; None: = clip
    clip_c: float | None = None  # dual-clip bound on negative-advantage tokens
    policy_loss: F.PolicyLoss = "clip"
    kl_estimator: est.KLEstimator = "k1"  # of the per-token KL penalty in the rewards
    agg_norm: float | None = None  # seq-mean-token-sum-norm's divisor

    @classmethod
    def from_spec(cls, spec: AlgorithmSpec, *, pad_id: int = 0, share_prompts: bool = False,
                  max_tokens: int | None = None) -> PPO:
        return cls(clip=spec.clip_low_value, kl_coef=spec.kl_coef, gamma=spec.gamma, lam=spec.lam,
                   critic=spec.critic, pad_id=pad_id, tis_cap=spec.tis_cap,
                   correction=RC.Correction.from_spec(spec.rollout_correction),
                   tis_mode=spec.tis_mode, share_prompts=share_prompts, clip_high=spec.clip_high_value,
                   clip_c=spec.clip_c, policy_loss=spec.policy_loss, kl_estimator=spec.kl_estimator or "k1",
                   reduction=spec.loss_agg, agg_norm=spec.loss_agg_norm or max_tokens)

    @property
    def name(self) -> str:
        return "ppo"

    @property
    def needs_reference(self) -> bool:
        return self.kl_coef > 0

    @property
    def needs_old_logprobs(self) -> bool:
        return True

    @property
    def needs_values(self) -> bool:
        return self.critic

    def token_rewards(self, samples: Sequence[Sample]) -> list[list[float]]:
        """Per-token rewards: -kl_coef * KL(old, ref) on each of the model's tokens (0 on an environment's),
        plus the score on the last token the model chose."""
        old = per_token(samples, "old_logprobs")
        ref = per_token(samples, "ref_logprobs")
        if self.kl_coef > 0 and (old is None or ref is None):
            raise AlgorithmError("ppo with kl_coef > 0 needs old_logprobs and ref_logprobs on every sample")
        out: list[list[float]] = []
        for i, (s, model) in enumerate(zip(samples, model_tokens(samples), strict=True)):
            n = len(s.completion_ids)
            r = [0.0] * n
            if self.kl_coef > 0 and old is not None and ref is not None:
                kl = est.kl(self.kl_estimator, torch.tensor(old[i]), torch.tensor(ref[i])) * torch.tensor(model)
                r = (-self.kl_coef * kl).tolist()
            if n:
                r[last_model_token(model)] += s.reward
            out.append(r)
        return out

    def baseline_values(self, samples: Sequence[Sample]) -> list[list[float]]:
        """Values per token: the critic's, or the mean score of the sample's group."""
        if self.critic:
            values = per_token(samples, "values")
            if values is None:
                raise AlgorithmError("ppo with critic needs values on every sample")
            return values
        sums: dict[int, list[float]] = {}
        for s in samples:
            sums.setdefault(s.group, []).append(s.reward)
        return [[sum(sums[s.group]) / len(sums[s.group])] * len(s.completion_ids) for s in samples]

    def prepare(self, samples: Sequence[Sample], token_budget: int) -> PackedBatch:
        batch = pack_samples(samples, token_budget, pad_id=self.pad_id, share_prompts=self.share_prompts)
        rewards = self.token_rewards(samples)
        values = self.baseline_values(samples)
        t_max = max((len(s.completion_ids) for s in samples), default=0)
        r = _padded(rewards, t_max)
        v = _padded(values, t_max)
        m = _padded(model_tokens(samples), t_max)  # GAE and whitening over the model's tokens only
        adv, ret = F.gae(r, v, m, self.gamma, self.lam)
        if self.whiten and m.sum() > 1:
            adv = F.masked_whiten(adv, m)
        lengths = [len(s.completion_ids) for s in samples]
        batch.token_fields["advantages"] = batch.scatter([adv[i, :n] for i, n in enumerate(lengths)])
        batch.token_fields["returns"] = batch.scatter([ret[i, :n] for i, n in enumerate(lengths)])
        batch.token_fields["old_values"] = batch.scatter(values)
        for name in ("old_logprobs", "rollout_logprobs"):
            values_of = per_token(samples, name)
            if values_of is not None:
                batch.token_fields[name] = batch.scatter(values_of)
        batch.weights = F.loss_weights(batch.loss_mask, batch.seq_index, self.reduction, norm=self.agg_norm)
        scores = torch.tensor([s.reward for s in samples], dtype=torch.float32)
        batch.stats.update({
            "reward_mean": float(scores.mean()) if scores.numel() else 0.0,
            "return_mean": float(F.masked_mean(ret, m)),
            "value_mean": float(F.masked_mean(v, m)),  # the critic's (or the group baseline's)
            "advantage_abs_mean": float(F.masked_mean(adv.abs(), m)),
        })
        return batch

    def loss(self, logprobs: torch.Tensor, batch: PackedBatch) -> tuple[torch.Tensor, Metrics]:
        if batch.weights is None:
            raise AlgorithmError("batch was not prepared by PPO.prepare (no weights)")
        batch = batch.to(logprobs.device)
        terms = policy_terms(self, logprobs, batch)
        mask = terms.mask
        loss = torch.where(mask > 0, terms.pg * batch.weights, 0.0).sum()
        return loss, terms.mismatch | terms.metrics(loss) | {
            "approx_kl_old": float(F.masked_mean((terms.old - terms.logprobs.detach()), mask)),
        }

    def critic_loss(self, values: torch.Tensor, batch: PackedBatch) -> tuple[torch.Tensor, Metrics]:
        """Clipped value loss of the critic's `[R, L]` values (aligned like log-probs)."""
        if batch.weights is None:
            raise AlgorithmError("batch was not prepared by PPO.prepare (no weights)")
        batch = batch.to(values.device)
        mask = batch.loss_mask
        (values,) = F.masked_inputs(mask, values)
        vl, clipped = F.clipped_value_loss(
            values, batch.token_fields["old_values"], batch.token_fields["returns"], self.value_clip)
        loss = torch.where(mask > 0, vl * batch.weights, 0.0).sum()
        return loss, {"value_loss": float(loss.detach()),
                      "value_clip_frac": float(F.masked_mean(clipped, mask))}


def _padded(rows: Sequence[Sequence[float]], width: int) -> torch.Tensor:
    out = torch.zeros(len(rows), width, dtype=torch.float32)
    for i, row in enumerate(rows):
        out[i, :len(row)] = torch.as_tensor(list(row), dtype=torch.float32)
    return out
