"""The clipped policy-gradient term GRPO and PPO share, and its metrics.

Role: `policy_terms(algo, logprobs, batch)` is one step's per-token policy loss of a prepared batch: the
ratio of the trained log-probs to the old ones (the batch's `old_logprobs`, or the trained ones detached
when the step is on-policy), clipped by `algo.policy_loss` (clip, dual-clip, GSPO, CISPO) against the
batch's `advantages`, times the rollout-correction weights against the rollout's log-probs where the batch
carries them. `PolicyTerms.metrics(loss)` reports what both algorithms log of it. Callers: `grpo.GRPO.loss`
(which may add the KL term) and `ppo.PPO.loss`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from tandem.sidecars.algorithms import functional as F
from tandem.sidecars.algorithms import rollout_correction as RC
from tandem.sidecars.algorithms.algorithm_interface import Metrics
from tandem.sidecars.algorithms.packing import PackedBatch


class ClippedPolicy(Protocol):
    """The settings of the policy term (GRPO's and PPO's fields of these names)."""

    clip: float
    clip_high: float | None
    clip_c: float | None
    policy_loss: F.PolicyLoss
    tis_cap: float | None
    tis_mode: str
    correction: RC.Correction | None


@dataclass(frozen=True)
class PolicyTerms:
    pg: torch.Tensor  # per-token policy loss, times the rollout-correction weights
    logprobs: torch.Tensor  # the trained log-probs, masked
    old: torch.Tensor  # the old log-probs, masked
    mask: torch.Tensor
    advantages: torch.Tensor
    ratio: torch.Tensor
    clipped: torch.Tensor
    clip: float
    high: float
    policy_loss: F.PolicyLoss
    mismatch: Metrics  # rollout correction's metrics (empty without the rollout's log-probs)

    def metrics(self, loss: torch.Tensor) -> Metrics:
        """The step's loss and what the policy term reports of it: pg_loss, clip_frac, ratio_mean, the
        policy loss's own metrics, tokens."""
        mask = self.mask
        return {
            "loss": float(loss.detach()),
            "pg_loss": float(F.masked_mean(self.pg.detach(), mask)),
            "clip_frac": float(F.masked_mean(self.clipped, mask)),
            "ratio_mean": float(F.masked_mean(self.ratio.detach(), mask)),
            **F.policy_metrics(self.logprobs, self.ratio, self.advantages, mask, self.clip, self.high,
                               self.policy_loss),
            "tokens": float(mask.sum()),
        }


def policy_terms(algo: ClippedPolicy, logprobs: torch.Tensor, batch: PackedBatch) -> PolicyTerms:
    """The policy term of `batch` (already on `logprobs`' device) for the trained `logprobs`."""
    mask = batch.loss_mask
    old = batch.token_fields.get("old_logprobs")
    old = logprobs.detach() if old is None else old
    logprobs, old = F.masked_inputs(mask, logprobs, old)
    high = algo.clip if algo.clip_high is None else algo.clip_high
    advantages = batch.token_fields["advantages"]
    pg, ratio, clipped = F.policy_loss(algo.policy_loss, logprobs, old, advantages, mask, batch.seq_index,
                                       algo.clip, high, algo.clip_c)
    mismatch: Metrics = {}
    behaviour = batch.token_fields.get("rollout_logprobs")
    if behaviour is not None:
        tis, mismatch = RC.weights(old, behaviour, mask, batch.seq_index,
                                   RC.Correction.of(algo.correction, algo.tis_cap, algo.tis_mode))
        pg = pg * tis
    return PolicyTerms(pg=pg, logprobs=logprobs, old=old, mask=mask, advantages=advantages, ratio=ratio,
                       clipped=clipped, clip=algo.clip, high=high, policy_loss=algo.policy_loss, mismatch=mismatch)
