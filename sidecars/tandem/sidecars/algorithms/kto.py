"""KTO (Kahneman-Tversky Optimization, Ethayarajh et al. 2024) on a labelled dataset.

Role: trains on single completions labelled desirable or undesirable, no preference pairs. With
r = log pi(y|x) - log pi_ref(y|x) (sums over the completion) and z0 the KL estimate, a desirable
example loses lambda_D (1 - sigmoid(beta (r - z0))) and an undesirable one lambda_U (1 - sigmoid(beta
(z0 - r))); the batch loss is the mean over its examples (`KTO.loss`: each micro-batch's sum divided
by the batch's example count, so micro-batch losses add up to the whole batch's).

z0 is the paper's (and TRL's) reference point: the mean of r over *mismatched* pairs, prompt i with
the completion of example (i + 1) mod n of the same batch, detached and clamped at >= 0. Those pairs
travel as extra samples marked `kl_probe` (`kl_probes`), so the Inference phase fills their policy
(`needs_old_logprobs`) and reference (`needs_reference`) log-probs like any sample's; `prepare` turns
them into z0 and packs only the examples. With one optimizer step per batch the policy's log-probs
before the step are the policy's at the step, so z0 is exact; with more steps (epochs,
globalBatchSize) it stays the batch's starting estimate, as the loss treats it as a constant anyway.
`prepare` also reports the pre-step rewards (beta r) of each class over the whole batch, which a
micro-batch holding one class only could not.

Callers: the driver via `algorithm_choice.make_algorithm` (algorithm.name kto), the offline source
(`trainer/offline.py`, `kl_probes`), the trainer engine (`loss` per micro-batch).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

from tandem.sidecars.algorithms import functional as F
from tandem.sidecars.algorithms.algorithm_interface import AlgorithmError, Metrics, Sample, pack_samples
from tandem.sidecars.algorithms.packing import PackedBatch

if TYPE_CHECKING:
    from tandem.spec.models import Algorithm as AlgorithmSpec


def kl_probes(examples: Sequence[Sample]) -> list[Sample]:
    """One KL probe per example: its prompt with the completion of example (i + 1) mod n."""
    n = len(examples)
    return [Sample(prompt_ids=list(s.prompt_ids), completion_ids=list(examples[(i + 1) % n].completion_ids),
                   group=s.group, kl_probe=True) for i, s in enumerate(examples)]


def _logratio(sample: Sample, i: int, field: str) -> float:
    """Sequence sum of `field` (policy log-probs) minus that of the reference."""
    policy, ref = getattr(sample, field), sample.ref_logprobs
    n = len(sample.completion_ids)
    if policy is None or ref is None or len(policy) != n or len(ref) != n:
        raise AlgorithmError(f"kto needs {field} and ref_logprobs on every sample (sample {i})")
    return float(sum(policy)) - float(sum(ref))


@dataclass
class KTO:
    beta: float = 0.1
    desirable_weight: float = 1.0  # lambda_D
    undesirable_weight: float = 1.0  # lambda_U
    pad_id: int = 0
    share_prompts: bool = False  # examples of one prompt packed with it once per row (packing.py)

    @classmethod
    def from_spec(cls, spec: AlgorithmSpec, *, pad_id: int = 0, share_prompts: bool = False,
                  max_tokens: int | None = None) -> KTO:
        return cls(beta=spec.beta, desirable_weight=spec.desirable_weight,
                   undesirable_weight=spec.undesirable_weight, pad_id=pad_id, share_prompts=share_prompts)

    @property
    def name(self) -> str:
        return "kto"

    @property
    def needs_reference(self) -> bool:
        return True

    @property
    def needs_old_logprobs(self) -> bool:
        return True  # the KL probes' policy log-probs (z0); the examples' give the pre-step rewards

    @property
    def needs_values(self) -> bool:
        return False

    def prepare(self, samples: Sequence[Sample], token_budget: int) -> PackedBatch:
        examples = [i for i, s in enumerate(samples) if not s.kl_probe]
        probes = [i for i, s in enumerate(samples) if s.kl_probe]
        if not examples:
            raise AlgorithmError("kto batch holds no labelled example")
        if not probes:
            raise AlgorithmError("kto needs KL probes (kl_probes(examples)) beside its examples for z0")
        for i in examples:
            if samples[i].desirable is None:
                raise AlgorithmError(f"kto needs a label (Sample.desirable) on every example (sample {i})")
        z0 = max(0.0, sum(_logratio(samples[i], i, "old_logprobs") for i in probes) / len(probes))
        batch = pack_samples([samples[i] for i in examples], token_budget, pad_id=self.pad_id,
                             share_prompts=self.share_prompts)
        local = [p.sample for p in batch.placements]  # index into `examples`
        batch.placements = [replace(p, sample=examples[p.sample]) for p in batch.placements]
        batch.seq_fields["desirable"] = torch.tensor([1.0 if samples[examples[k]].desirable else 0.0 for k in local])
        batch.seq_fields["ref_logps"] = torch.tensor(
            [sum(samples[examples[k]].ref_logprobs or []) for k in local], dtype=torch.float32)
        ratios = [(_logratio(samples[i], i, "old_logprobs"), bool(samples[i].desirable)) for i in examples]
        chosen = [self.beta * r for r, d in ratios if d]
        rejected = [self.beta * r for r, d in ratios if not d]
        batch.stats.update({
            "kl": z0, "examples": float(len(examples)), "desirable": len(chosen) / len(examples),
            "rewards_chosen": sum(chosen) / max(len(chosen), 1),
            "rewards_rejected": sum(rejected) / max(len(rejected), 1),
            "kto_loss": sum(self._loss_of(r, d, z0) for r, d in ratios) / len(examples)})
        return batch

    def _loss_of(self, r: float, desirable: bool, z0: float) -> float:
        """One example's loss (floats), as `loss` computes it on tensors."""
        if desirable:
            return self.desirable_weight * (1.0 - 1.0 / (1.0 + math.exp(-self.beta * (r - z0))))
        return self.undesirable_weight * (1.0 - 1.0 / (1.0 + math.exp(-self.beta * (z0 - r))))

    def loss(self, logprobs: torch.Tensor, batch: PackedBatch) -> tuple[torch.Tensor, Metrics]:
        total = batch.stats.get("examples", 0.0)
        if total <= 0 or not batch.placements:
            raise AlgorithmError("kto batch holds no labelled example: skip training on it")
        batch = batch.to(logprobs.device)
        z0 = batch.stats["kl"]
        policy = F.sequence_sums(logprobs, batch.loss_mask, batch.seq_index, len(batch.placements))
        r = policy - batch.seq_fields["ref_logps"]
        desirable = batch.seq_fields["desirable"] > 0
        per = torch.where(desirable, self.desirable_weight * (1 - torch.sigmoid(self.beta * (r - z0))),
                          self.undesirable_weight * (1 - torch.sigmoid(self.beta * (z0 - r))))
        loss = per.sum() / total
        return loss, {
            "loss": float(loss.detach()),
            "kto_loss": float(per.detach().mean()),
            "kl": z0,
            "examples": float(per.numel()),
        }
