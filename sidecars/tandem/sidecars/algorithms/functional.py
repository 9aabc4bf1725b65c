"""The RL maths as pure torch functions: advantages, clipped losses, KL, GAE, DPO.

Role: the losses and their aggregation, written once, free of any engine, and checked against
hand-computed cases in tests/algorithms (advantage and KL estimators: `estimators`). Callers:
`grpo`, `ppo`, `dpo`, `estimators` in this package.

Shapes: per-token tensors are `[R, L]` aligned as in `packing` (log-prob at t is of token t+1);
`mask` is 1.0 on the tokens that count. Losses are reduced with `weights` from `loss_weights`
(sum of weights = 1 over the whole batch), so a row-split into micro-batches sums back to the
full-batch loss.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch

Reduction = Literal["token", "sequence"]  # the names of token-mean and seq-mean-token-mean before lossAgg
LossAgg = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
PolicyLoss = Literal["clip", "gspo", "cispo"]


def group_advantages(
    rewards: torch.Tensor, groups: Sequence[int], *, scale: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """GRPO advantages: (reward - mean of its group) / (std of its group + eps).

    The std is the unbiased sample std (torch's default); `scale=False` leaves the centred reward
    (Dr. GRPO). A group of one sample gets advantage 0.
    """
    rewards = rewards.to(torch.float32)
    group_ids = torch.as_tensor(list(groups), dtype=torch.int64)
    out = torch.zeros_like(rewards)
    for g in torch.unique(group_ids).tolist():
        sel = group_ids == g
        r = rewards[sel]
        if r.numel() < 2:
            continue
        centred = r - r.mean()
        out[sel] = centred / (r.std() + eps) if scale else centred
    return out


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / std over the masked entries (population std); unmasked entries become 0."""
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    return (x - mean) * torch.rsqrt(var + eps) * mask


def loss_weights(mask: torch.Tensor, seq_index: torch.Tensor, reduction: Reduction | LossAgg,
                 norm: float | None = None) -> torch.Tensor:
    """Per-token weights of the batch's loss (`algorithm.lossAgg`); the loss is sum(weight x per-token loss).

    "token-mean" ("token"): every loss token weighs the same, 1 / tokens in the batch (DAPO); long
    answers count more. "seq-mean-token-mean" ("sequence"): each sequence's tokens are averaged first,
    then sequences equally, 1 / (its tokens x sequences) (the original GRPO). "seq-mean-token-sum":
    tokens summed per sequence, sequences averaged, 1 / sequences. "seq-mean-token-sum-norm": the same
    divided by the constant `norm` (Dr. GRPO: the generation limit), 1 / (sequences x norm), so no
    length enters the normaliser. The first two sum to 1 over the batch.
    """
    if reduction in ("token", "token-mean"):
        return mask / mask.sum().clamp(min=1.0)
    if reduction in ("seq-mean-token-sum", "seq-mean-token-sum-norm"):
        ids = torch.where(mask > 0, seq_index, -1)
        n_seqs = int(torch.unique(ids[ids >= 0]).numel())
        divisor = max(n_seqs, 1) * (float(norm) if reduction == "seq-mean-token-sum-norm" and norm else 1.0)
        return mask / divisor
    ids = torch.where(mask > 0, seq_index, -1)
    n = int(seq_index.max().item()) + 1 if seq_index.numel() else 0
    sel = ids[ids >= 0]
    counts = torch.zeros(max(n, 1), device=mask.device).index_add_(0, sel, torch.ones(sel.numel(), device=mask.device))
    n_seqs = int((counts > 0).sum())
    per_token = torch.where(ids >= 0, 1.0 / counts[ids.clamp(min=0)].clamp(min=1.0), 0.0)
    return per_token / max(n_seqs, 1)


def clipped_policy_loss(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, clip: float,
    clip_high: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token PPO surrogate loss `-min(ratio * A, clip(ratio, 1 - clip, 1 + clip_high) * A)`.

    Returns (loss, ratio, clipped) where `clipped` is 1.0 where the clipped term was chosen.
    """
    ratio = torch.exp(logprobs - old_logprobs)
    loss, was_clipped = _clipped_surrogate(ratio, advantages, clip, clip if clip_high is None else clip_high)
    return loss, ratio, was_clipped


def _clipped_surrogate(ratio: torch.Tensor, advantages: torch.Tensor, low: float,
                       high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """`-min(r A, clip(r, 1 - low, 1 + high) A)` and where the clipped term was chosen (1.0)."""
    unclipped = ratio * advantages
    clipped_term = torch.clamp(ratio, 1.0 - low, 1.0 + high) * advantages
    return -torch.minimum(unclipped, clipped_term), (clipped_term < unclipped).to(torch.float32)


def policy_loss(
    mode: str, logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
    seq_index: torch.Tensor, clip_low: float, clip_high: float, clip_c: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token policy loss of `algorithm.policyLoss`; returns (loss, ratio, clipped).

    clip: PPO's `-min(r A, clip(r, 1 - low, 1 + high) A)` with r = pi / pi_old per token; with
    `clip_c` (dual-clip) a negative-advantage token's loss is at most `-clip_c A`.
    gspo: the sequence's ratio s = exp(mean over its tokens of log(pi / pi_old)), applied to every token
    as s x pi / sg(pi) (the value s, the gradient of each token's log-prob scaled by s) and clipped
    like PPO's; clipped is then whole sequences.
    cispo: the clipped importance weight as a stop-gradient coefficient, `-sg(clip(r, 1 - low, 1 + high)) A log pi`:
    every token keeps a gradient, clipping bounds its size.
    """
    log_ratio = logprobs - old_logprobs
    if mode == "gspo":
        ids = torch.where(mask > 0, seq_index, -1)
        n = int(ids.max().item()) + 1 if ids.numel() else 0
        sel = ids >= 0
        sums = torch.zeros(max(n, 1), device=logprobs.device).index_add(0, ids[sel], log_ratio.detach()[sel])
        counts = torch.zeros(max(n, 1), device=logprobs.device).index_add(
            0, ids[sel], torch.ones_like(log_ratio)[sel])
        seq_log_ratio = torch.where(sel, (sums / counts.clamp(min=1.0))[ids.clamp(min=0)], 0.0)
        ratio = torch.exp(seq_log_ratio + logprobs - logprobs.detach())
    else:
        ratio = torch.exp(log_ratio)
    if mode == "cispo":
        bounded = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
        loss = -bounded.detach() * advantages * logprobs
        return loss, ratio, (bounded != ratio).to(torch.float32)
    if mode not in ("clip", "gspo"):
        raise ValueError(f"unknown policy loss {mode!r} (clip, gspo, cispo)")
    loss, was_clipped = _clipped_surrogate(ratio, advantages, clip_low, clip_high)
    if clip_c is not None:
        cap = -clip_c * advantages
        dual = (advantages < 0) & (loss > cap)
        loss = torch.where(dual, cap, loss)
        was_clipped = torch.where(dual, 1.0, was_clipped)
    return loss, ratio, was_clipped


def policy_metrics(
    logprobs: torch.Tensor, ratio: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, clip_low: float,
    clip_high: float, mode: str = "clip",
) -> dict[str, float]:
    """What every peer shows of a policy step, over the masked tokens.

    clip_frac_low: tokens the lower bound holds (A < 0 and r < 1 - low: the update would push pi further
    down); clip_frac_high: the upper bound (A > 0 and r > 1 + high); for cispo, whose weight is clipped
    whatever the advantage's sign, r below or above the bounds. ratio_std: the spread of r (its mean is
    ratio_mean). entropy: the sampled-token estimate -mean log pi(y_t) of the policy's per-token entropy
    (unbiased for samples drawn from the policy at temperature 1; with stale samples or another
    temperature, the cross-entropy of the sampler's tokens under the policy).
    """
    r = ratio.detach()
    below, above = r < 1.0 - clip_low, r > 1.0 + clip_high
    if mode != "cispo":
        below, above = below & (advantages < 0), above & (advantages > 0)
    mean = masked_mean(r, mask)
    return {
        "clip_frac_low": float(masked_mean(below.to(torch.float32), mask)),
        "clip_frac_high": float(masked_mean(above.to(torch.float32), mask)),
        "ratio_std": float(masked_mean((r - mean) ** 2, mask).sqrt()),
        "entropy": float(masked_mean(-logprobs.detach(), mask)),
    }


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, bound: float = 20.0) -> torch.Tensor:
    """Per-token k3 estimator of KL(policy || reference): exp(d) - d - 1 with d = ref - logp (>= 0).

    d is clamped to [-bound, bound] so that exp never overflows.
    """
    d = torch.clamp(ref_logprobs - logprobs, -bound, bound)
    return torch.exp(d) - d - 1.0


def masked_inputs(mask: torch.Tensor, *tensors: torch.Tensor) -> list[torch.Tensor]:
    """Each tensor with 0 where `mask` is 0, so that values outside the loss (padding, prompts)
    cannot make exp() overflow and poison gradients with NaN through `torch.where`."""
    return [torch.where(mask > 0, t, torch.zeros_like(t)) for t in tensors]


def gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over `[B, T]` per-token rewards and values.

    Masked-out steps are skipped (the next unmasked step bootstraps); the value after the last
    unmasked step is 0 (episode end). Returns (advantages, returns = advantages + values), both 0
    where `mask` is 0.
    """
    adv = torch.zeros_like(rewards, dtype=torch.float32)
    next_value = torch.zeros(rewards.shape[0], device=rewards.device)
    running = torch.zeros(rewards.shape[0], device=rewards.device)
    for t in reversed(range(rewards.shape[1])):
        m = mask[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        step = delta + gamma * lam * running
        running = torch.where(m > 0, step, running)
        next_value = torch.where(m > 0, values[:, t], next_value)
        adv[:, t] = running * m
    return adv, (adv + values) * mask


def clipped_value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, clip: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token PPO critic loss 0.5 * max((V - R)^2, (clip(V, V_old +- clip) - R)^2).

    Returns (loss, clipped) with `clipped` 1.0 where the clipped error was the larger one.
    """
    v_clip = old_values + torch.clamp(values - old_values, -clip, clip)
    err = (values - returns) ** 2
    err_clip = (v_clip - returns) ** 2
    return 0.5 * torch.maximum(err, err_clip), (err_clip > err).to(torch.float32)


def sequence_sums(
    per_token: torch.Tensor, mask: torch.Tensor, seq_index: torch.Tensor, n: int
) -> torch.Tensor:
    """Sum of `per_token * mask` within each sequence (`seq_index` in [0, n)) -> `[n]`."""
    sel = (mask > 0) & (seq_index >= 0)
    out = torch.zeros(n, dtype=per_token.dtype, device=per_token.device)
    return out.index_add(0, seq_index[sel], per_token[sel])


def dpo_loss(
    policy_chosen: torch.Tensor, policy_rejected: torch.Tensor,
    ref_chosen: torch.Tensor, ref_rejected: torch.Tensor, beta: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-pair DPO loss -log sigmoid(beta * ((pi_c - ref_c) - (pi_r - ref_r))) from sequence log-probs.

    Returns (loss, margin) where margin is the implicit reward difference beta * (...).
    """
    margin = beta * ((policy_chosen - ref_chosen) - (policy_rejected - ref_rejected))
    return -torch.nn.functional.logsigmoid(margin), margin
