"""GRPO, the default algorithm: group-relative advantages, clipped ratio, k3 KL to the reference.

Role: `GRPO.prepare` turns each prompt's group of scored completions into per-token advantages
(the sample's group-normalised reward on every completion token); `GRPO.loss` is the clipped
surrogate plus `kl_coef` x the k3 KL estimator, per token. When the samples carry the rollout
engine's own log-probs, the loss reports the rollout/trainer mismatch and, with `tis_cap`,
weighs each token by the truncated importance ratio p_trainer / p_rollout (`F.rollout_mismatch`).
Callers: the driver via
`make_algorithm`, the trainer engine via `loss`.

Averaging default: "token" — the loss is the mean over all completion tokens of the batch (each
token weighs the same, as in DAPO / Dr. GRPO), which does not favour short completions the way
the per-sequence mean does; `reduction="sequence"` gives the original per-sequence mean.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from tandem.sidecars.algorithms import functional as F
from tandem.sidecars.algorithms.base import AlgorithmError, Metrics, Sample, pack_samples, per_token
from tandem.sidecars.algorithms.packing import PackedBatch

if TYPE_CHECKING:
    from tandem.spec.models import Algorithm as AlgorithmSpec


@dataclass
class GRPO:
    clip: float = 0.2
    kl_coef: float = 0.001
    scale_advantages: bool = True  # divide by the group std (False: Dr. GRPO)
    reduction: F.Reduction = "token"
    clip_high: float | None = None  # asymmetric upper clip (DAPO "clip-higher"); None: = clip
    pad_id: int = 0
    tis_cap: float | None = None  # truncated importance sampling against the rollout's log-probs
    tis_mode: str = "truncate"  # or "mask": drop the tokens whose weight exceeds tis_cap
    share_prompts: bool = False  # a group's prompt packed once per row (packing.py)

    @classmethod
    def from_spec(cls, spec: AlgorithmSpec, *, pad_id: int = 0, share_prompts: bool = False) -> GRPO:
        return cls(clip=spec.clip, kl_coef=spec.kl_coef, pad_id=pad_id, tis_cap=spec.tis_cap,
                   tis_mode=spec.tis_mode, share_prompts=share_prompts)

    @property
    def name(self) -> str:
        return "grpo"

    @property
    def needs_reference(self) -> bool:
        return self.kl_coef > 0

    @property
    def needs_old_logprobs(self) -> bool:
        return False

    @property
    def needs_values(self) -> bool:
        return False

    def prepare(self, samples: Sequence[Sample], token_budget: int) -> PackedBatch:
        batch = pack_samples(samples, token_budget, pad_id=self.pad_id, share_prompts=self.share_prompts)
        rewards = torch.tensor([s.reward for s in samples], dtype=torch.float32)
        groups = [s.group for s in samples]
        adv = F.group_advantages(rewards, groups, scale=self.scale_advantages)
        batch.token_fields["advantages"] = batch.scatter(
            [[float(a)] * len(s.completion_ids) for a, s in zip(adv.tolist(), samples, strict=True)])
        for name in ("old_logprobs", "rollout_logprobs"):
            values = per_token(samples, name)
            if values is not None:
                batch.token_fields[name] = batch.scatter(values)
        ref = per_token(samples, "ref_logprobs")
        if self.needs_reference:
            if ref is None:
                raise AlgorithmError("grpo with kl_coef > 0 needs ref_logprobs on every sample")
            batch.token_fields["ref_logprobs"] = batch.scatter(ref)
        batch.weights = F.loss_weights(batch.loss_mask, batch.seq_index, self.reduction)
        batch.stats.update(_group_stats(rewards, groups, adv, samples))
        return batch

    def loss(self, logprobs: torch.Tensor, batch: PackedBatch) -> tuple[torch.Tensor, Metrics]:
        if batch.weights is None:
            raise AlgorithmError("batch was not prepared by GRPO.prepare (no weights)")
        batch = batch.to(logprobs.device)
        mask = batch.loss_mask
        old = batch.token_fields.get("old_logprobs")
        old = logprobs.detach() if old is None else old
        logprobs, old = F.masked_inputs(mask, logprobs, old)
        pg, ratio, clipped = F.clipped_policy_loss(
            logprobs, old, batch.token_fields["advantages"], self.clip, self.clip_high)
        metrics: Metrics = {}
        behaviour = batch.token_fields.get("rollout_logprobs")
        if behaviour is not None:
            tis, mismatch = F.rollout_mismatch(old, behaviour, mask, self.tis_cap, self.tis_mode)
            pg = pg * tis
            metrics.update(mismatch)
        per_tok = pg
        if self.kl_coef > 0:
            (ref,) = F.masked_inputs(mask, batch.token_fields["ref_logprobs"])
            kl = F.kl_k3(logprobs, ref)
            per_tok = pg + self.kl_coef * kl
            metrics["kl"] = float(F.masked_mean(kl.detach(), mask))
        loss = torch.where(mask > 0, per_tok * batch.weights, 0.0).sum()
        metrics.update({
            "loss": float(loss.detach()),
            "pg_loss": float(F.masked_mean(pg.detach(), mask)),
            "clip_frac": float(F.masked_mean(clipped, mask)),
            "ratio_mean": float(F.masked_mean(ratio.detach(), mask)),
            "tokens": float(mask.sum()),
        })
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
    }
