"""Importance weights of the rollout's samples against the trainer, and the measures of their gap.

Role: `weights` turns the trainer's and the rollout engine's log-probs of the sampled tokens into the
per-token weights the policy loss is multiplied by (`algorithm.rolloutCorrection`, or `tisCap`/`tisMode`
at token level), and the statistics of the gap; `summarize` turns those statistics, summed over
micro-batches, into the batch's metrics. Callers: `grpo.GRPO.loss`, `ppo.PPO.loss` (weights),
`trainer.loop.phases.train.train` (summarize), tests/algorithms/test_rollout_correction.py.

With rho_t = p_trainer(y_t) / p_rollout(y_t) on the model's tokens (the loss mask: no prompt, padding or
environment token), the weight w_t of token t is
- level token: rho = rho_t;
- level sequence: rho = prod_t rho_t (aggregate product) or exp(mean_t log rho_t) (geometric), the same
  on every token of the sequence;
- truncate (TIS): w = min(rho, high); mask (MIS) and icepop: w = rho if low <= rho <= high, else 0 (the
  token, or the whole sequence, leaves the loss; it still counts in the loss's normaliser, as in IcePop's
  objective). log rho is clamped to [-20, 20] before exp. The weights are constants (no gradient).
Measured in every case (`rc_*` sums; one micro-batch's loss cannot see the batch, so ratios are taken
after the engine has summed them, and each is exact over the batch): mismatch_mean = mean |log rho_t|,
mismatch_max = max |log rho_t| (the engines keep the largest over micro-batches), mismatch_kl = mean
k3(rho_t) = rho_t - 1 - log rho_t (an unbiased estimate of KL(rollout || trainer) per token, >= 0),
mismatch_ess = (sum rho_t)^2 / (n sum rho_t^2) (the normalised effective sample size of the raw token
ratios: 1 when they agree); with a correction, is_ess (the same of the applied weights w_t), tis_clip_frac
at token level (tokens whose rho_t exceeds high, the cap, whatever the mode), is_token_clipped_frac /
is_token_masked_frac (tokens whose weight was truncated / masked) and is_seq_clipped_frac /
is_seq_masked_frac (sequences with such a token).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from tandem.spec.rollout_correction import RolloutCorrection as CorrectionSpec

BOUND = 20.0  # |log rho| at most: exp never overflows
MODES = ("truncate", "mask", "icepop")


@dataclass(frozen=True)
class Correction:
    level: str = "token"  # token | sequence
    mode: str = "truncate"  # truncate | mask | icepop
    aggregate: str = "product"  # level sequence: product | geometric
    low: float = 0.0  # mask, icepop: weights below it are masked
    high: float = 2.0  # truncate's cap; mask's and icepop's upper end

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"unknown importance-weight mode {self.mode!r} (truncate, mask, icepop)")
        if self.level not in ("token", "sequence") or self.aggregate not in ("product", "geometric"):
            raise ValueError(f"unknown level {self.level!r} or aggregate {self.aggregate!r}")

    @classmethod
    def from_spec(cls, spec: CorrectionSpec | None) -> Correction | None:
        if spec is None:
            return None
        low, high = spec.bounds
        return cls(level=spec.level, mode=spec.mode, aggregate=spec.aggregate_value, low=low, high=high)

    @classmethod
    def of(cls, correction: Correction | None, tis_cap: float | None, tis_mode: str) -> Correction | None:
        """The correction an algorithm applies: its own, or the tisCap/tisMode shorthand (token level)."""
        if correction is not None or tis_cap is None:
            return correction
        return cls(level="token", mode=tis_mode, high=tis_cap)


def weights(trainer_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor,
            seq_index: torch.Tensor, correction: Correction | None) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-token weights `[R, L]` (1 without a correction; no gradient) and the micro-batch's metrics:
    mismatch_max (the largest |log p_trainer - log p_rollout|; the engines keep a `*_max` metric's largest over
    micro-batches) and the `rc_*` sums `summarize` turns into the batch's ratios."""
    on = mask > 0
    diff = torch.where(on, trainer_logprobs.detach() - rollout_logprobs, 0.0)
    gap = diff.abs()
    d = diff.clamp(-BOUND, BOUND).double()
    rho = torch.exp(d)
    stats = {"mismatch_max": float(gap.max()) if gap.numel() else 0.0}
    stats.update(rc_tokens=float(on.sum()), rc_gap=float(gap[on].sum()),
                 rc_k3=float((torch.where(on, rho - 1.0 - d, 0.0)).sum()),
                 rc_ratio=float(rho[on].sum()), rc_ratio_sq=float((rho[on] ** 2).sum()))
    if correction is None:
        return torch.ones_like(trainer_logprobs), stats
    log_w = d if correction.level == "token" else _sequence_log_ratio(d, on, seq_index, correction.aggregate)
    ratio = torch.exp(log_w.clamp(-BOUND, BOUND))
    if correction.mode == "truncate":
        cut = on & (ratio > correction.high)
        w = torch.clamp(ratio, max=correction.high)
        clipped, masked = cut, torch.zeros_like(cut)
    else:
        masked = on & ((ratio < correction.low) | (ratio > correction.high))
        w = torch.where(masked, 0.0, ratio)
        clipped = torch.zeros_like(masked)
    w = torch.where(on, w, 1.0)
    if correction.level == "token":  # tokens whose raw ratio exceeds the cap (tisCap's figure, whatever the mode)
        stats["rc_over_cap"] = float((on & (rho > correction.high)).sum())
    stats.update(rc_w=float(w[on].sum()), rc_w_sq=float((w[on] ** 2).sum()),
                 rc_tok_clipped=float(clipped.sum()), rc_tok_masked=float(masked.sum()),
                 rc_seqs=float(_count_sequences(on, seq_index)),
                 rc_seq_clipped=float(_count_sequences(clipped, seq_index)),
                 rc_seq_masked=float(_count_sequences(masked, seq_index)))
    return w.to(trainer_logprobs.dtype), stats


def _sequence_log_ratio(d: torch.Tensor, on: torch.Tensor, seq_index: torch.Tensor, aggregate: str) -> torch.Tensor:
    """Each token's sequence log-ratio: the sum (product) or mean (geometric) of its sequence's log rho_t."""
    ids = torch.where(on, seq_index, -1)
    n = int(ids.max().item()) + 1 if ids.numel() else 0
    sel = ids >= 0
    sums = torch.zeros(max(n, 1), dtype=d.dtype, device=d.device).index_add(0, ids[sel], d[sel])
    if aggregate == "geometric":
        counts = torch.zeros(max(n, 1), dtype=d.dtype, device=d.device).index_add(
            0, ids[sel], torch.ones_like(d[sel]))
        sums = sums / counts.clamp(min=1.0)
    return torch.where(sel, sums[ids.clamp(min=0)], 0.0)


def _count_sequences(where: torch.Tensor, seq_index: torch.Tensor) -> int:
    return int(torch.unique(seq_index[where & (seq_index >= 0)]).numel())


def summarize(metrics: Mapping[str, float]) -> dict[str, float]:
    """The batch's metrics from `weights`' sums (each possibly divided by one common count, as the
    engines' mean over micro-batches does): the `rc_*` entries replaced by the ratios they make."""
    out = {k: v for k, v in metrics.items() if not k.startswith("rc_")}
    n = metrics.get("rc_tokens", 0.0)
    if n <= 0:
        return out | ({"mismatch_mean": 0.0} if "rc_tokens" in metrics else {}) | \
            ({"tis_clip_frac": 0.0} if "rc_over_cap" in metrics else {})
    out["mismatch_mean"] = metrics["rc_gap"] / n
    if "rc_over_cap" in metrics:
        out["tis_clip_frac"] = metrics["rc_over_cap"] / n
    out["mismatch_kl"] = metrics["rc_k3"] / n
    out["mismatch_ess"] = _ess(metrics["rc_ratio"], metrics["rc_ratio_sq"], n)
    if "rc_w" in metrics:
        seqs = max(metrics["rc_seqs"], 1e-12)
        out.update(is_ess=_ess(metrics["rc_w"], metrics["rc_w_sq"], n),
                   is_token_clipped_frac=metrics["rc_tok_clipped"] / n,
                   is_token_masked_frac=metrics["rc_tok_masked"] / n,
                   is_seq_clipped_frac=metrics["rc_seq_clipped"] / seqs,
                   is_seq_masked_frac=metrics["rc_seq_masked"] / seqs)
    return out


def _ess(total: float, squares: float, n: float) -> float:
    """(sum w)^2 / (n sum w^2): 1 when every weight is equal, 1/n when one carries them all, 0 when none."""
    return total * total / (n * squares) if squares > 0 else 0.0
