"""DPO from rollouts: each prompt's best and worst completion form a preference pair.

Role: `DPO.prepare` picks, per prompt group, the completion with the highest reward (chosen) and
the lowest (rejected) — ties (max == min) give no pair and are skipped; the first occurrence wins
among equal rewards — and packs each pair into one row (so micro-batches never split a pair),
with the reference model's sequence log-probs; `DPO.loss` is -log sigmoid(beta x margin) averaged
over all pairs of the batch. Callers: the driver via `make_algorithm`, the trainer engine.

A batch with no pair (all groups tied) has zero rows: the driver skips training on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

from tandem.sidecars.algorithms import functional as F
from tandem.sidecars.algorithms.algorithm_interface import AlgorithmError, Metrics, Sample
from tandem.sidecars.algorithms.packing import PackedBatch, pack

if TYPE_CHECKING:
    from tandem.spec.models import Algorithm as AlgorithmSpec


def preference_pairs(samples: Sequence[Sample]) -> list[tuple[int, int]]:
    """(chosen, rejected) sample indices: per group, max and min reward; tied groups skipped."""
    by_group: dict[int, list[int]] = {}
    for i, s in enumerate(samples):
        by_group.setdefault(s.group, []).append(i)
    pairs: list[tuple[int, int]] = []
    for members in by_group.values():
        best = max(members, key=lambda i: (samples[i].reward, -i))
        worst = min(members, key=lambda i: (samples[i].reward, i))
        if samples[best].reward > samples[worst].reward:
            pairs.append((best, worst))
    return pairs


@dataclass
class DPO:
    beta: float = 0.1
    pad_id: int = 0
    share_prompts: bool = False  # a pair's prompt packed once per row (packing.py)

    @classmethod
    def from_spec(cls, spec: AlgorithmSpec, *, pad_id: int = 0, share_prompts: bool = False,
                  max_tokens: int | None = None) -> DPO:
        return cls(beta=spec.beta, pad_id=pad_id, share_prompts=share_prompts)

    @property
    def name(self) -> str:
        return "dpo"

    @property
    def needs_reference(self) -> bool:
        return True

    @property
    def needs_old_logprobs(self) -> bool:
        return False

    @property
    def needs_values(self) -> bool:
        return False

    def prepare(self, samples: Sequence[Sample], token_budget: int) -> PackedBatch:
        pairs = preference_pairs(samples)
        order = [i for pair in pairs for i in pair]
        for i in order:
            ref = samples[i].ref_logprobs
            if ref is None or len(ref) != len(samples[i].completion_ids):
                raise AlgorithmError(f"dpo needs ref_logprobs on every paired sample (sample {i})")
        batch = pack([samples[i].prompt_ids for i in order], [samples[i].completion_ids for i in order],
                     token_budget, units=[[2 * k, 2 * k + 1] for k in range(len(pairs))], pad_id=self.pad_id,
                     share_prompts=self.share_prompts)
        local = [p.sample for p in batch.placements]  # index into `order`
        batch.placements = [replace(p, sample=order[p.sample]) for p in batch.placements]
        batch.seq_fields["pair"] = torch.tensor([k // 2 for k in local], dtype=torch.int64)
        batch.seq_fields["sign"] = torch.tensor([1.0 if k % 2 == 0 else -1.0 for k in local])
        batch.seq_fields["ref_logps"] = torch.tensor(
            [sum(samples[order[k]].ref_logprobs or []) for k in local], dtype=torch.float32)
        batch.stats.update({"pairs": float(len(pairs)),
                            "pair_reward_gap": sum(samples[c].reward - samples[r].reward for c, r in pairs)
                            / max(len(pairs), 1)})
        return batch

    def loss(self, logprobs: torch.Tensor, batch: PackedBatch) -> tuple[torch.Tensor, Metrics]:
        total_pairs = batch.stats.get("pairs", 0.0)
        if total_pairs <= 0 or not batch.placements:
            raise AlgorithmError("dpo batch holds no preference pair: skip training on it")
        batch = batch.to(logprobs.device)
        dev = logprobs.device
        n = len(batch.placements)
        policy = F.sequence_sums(logprobs, batch.loss_mask, batch.seq_index, n)
        pair_ids, local_pair = torch.unique(batch.seq_fields["pair"], return_inverse=True)
        sign = batch.seq_fields["sign"]
        chosen = sign > 0
        k = int(pair_ids.numel())
        pi_c = torch.zeros(k, device=dev).index_add(0, local_pair[chosen], policy[chosen])
        pi_r = torch.zeros(k, device=dev).index_add(0, local_pair[~chosen], policy[~chosen])
        ref = batch.seq_fields["ref_logps"]
        ref_c = torch.zeros(k, device=dev).index_add(0, local_pair[chosen], ref[chosen])
        ref_r = torch.zeros(k, device=dev).index_add(0, local_pair[~chosen], ref[~chosen])
        per_pair, margin = F.dpo_loss(pi_c, pi_r, ref_c, ref_r, self.beta)
        loss = per_pair.sum() / total_pairs
        return loss, {
            "loss": float(loss.detach()),
            "dpo_loss": float(per_pair.detach().mean()),
            "reward_margin": float(margin.detach().mean()),
            "reward_accuracy": float((margin.detach() > 0).float().mean()),
            "pairs": float(k),
        }
