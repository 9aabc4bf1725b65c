"""Every policy loss and loss aggregation through the real Megatron engine (megatron-core on CPU, one
rank), against the formula written out here on transformers' own log-probs of the same model.

For PPO's clip with clip-higher and dual-clip, GSPO and CISPO, under each of the four `lossAgg`
aggregations: the loss of a Megatron train step, and the norm of its gradient over every parameter,
equal what autograd gives for the formula computed on transformers' per-sequence log-probs; and they
do so whether the batch is one micro-batch or one row per micro-batch, and with each group's prompt
packed once per row (shared prompts). The old log-probs are the model's own plus noise, so ratios
leave 1 and each clip binds on some tokens.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_models import make_family_dirs

from tandem.sidecars.algorithms.algorithm_interface import Sample, row_budget
from tandem.sidecars.algorithms.grpo import GRPO
from tandem.sidecars.trainer.engines.heads import shift_to_labels
from tandem.sidecars.trainer.engines.megatron_engine import MegatronEngine

pytestmark = pytest.mark.megatron
NORM = 8  # seq-mean-token-sum-norm's divisor
CASES = [  # (policyLoss, clip, clipHigh, clipC, lossAgg)
    ("clip", 0.2, 0.28, 1.1, "token-mean"),  # dual-clip binds where A < 0 and r > 1.1
    ("clip", 0.1, 0.1, None, "seq-mean-token-sum"),
    ("gspo", 0.05, 0.08, None, "seq-mean-token-mean"),
    ("cispo", 1.0, 0.1, None, "seq-mean-token-sum-norm"),
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_family_dirs(tmp_path_factory.mktemp("tiny-hf-losses"), ["qwen2"])["qwen2"]  # tied embeddings


@pytest.fixture(scope="module")
def samples(model_dir: Path) -> list[Sample]:
    """Three groups (2-3 completions of 1-6 tokens, prompts of 5-9), old log-probs = the model's + noise."""
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(11)
    out: list[Sample] = []
    for g, size in enumerate((3, 2, 3)):
        prompt = torch.randint(1, 128, (int(torch.randint(5, 10, (1,), generator=gen)),), generator=gen).tolist()
        for k in range(size):
            n = int(torch.randint(1, 7, (1,), generator=gen))
            s = Sample(prompt, torch.randint(1, 128, (n,), generator=gen).tolist(), group=g, reward=float((g + k) % 3))
            with torch.no_grad():
                own = hf_logprobs(hf, s)
            s.old_logprobs = (own + 0.3 * torch.randn(n, generator=gen)).tolist()
            out.append(s)
    return out


def hf_logprobs(hf: Any, s: Sample) -> torch.Tensor:
    """log pi of each completion token, from transformers on the whole sequence."""
    seq = torch.tensor([s.prompt_ids + s.completion_ids])
    logp = torch.log_softmax(hf(seq).logits[0].float(), dim=-1)
    n_p = len(s.prompt_ids)
    return logp[n_p - 1:-1].gather(1, seq[0, n_p:].unsqueeze(1)).squeeze(1)


def advantages(samples: list[Sample]) -> list[float]:
    """GRPO's: (reward - group mean) / (group std + 1e-6)."""
    out = []
    for s in samples:
        r = torch.tensor([o.reward for o in samples if o.group == s.group])
        out.append(float((s.reward - r.mean()) / (r.std() + 1e-6)))
    return out


def formula_loss(lp: list[torch.Tensor], old: list[torch.Tensor], adv: list[float],
                 case: tuple[Any, ...]) -> torch.Tensor:
    mode, low, high, clip_c, agg = case
    per_seq = []
    for lp_i, old_i, a in zip(lp, old, adv, strict=True):
        if mode == "gspo":  # the sequence's ratio as the value, each token's own log-prob carrying the gradient
            ratio = torch.exp((lp_i - old_i).mean()).detach() * torch.exp(lp_i - lp_i.detach())
        else:
            ratio = torch.exp(lp_i - old_i)
        if mode == "cispo":
            tok = -torch.clamp(ratio, 1 - low, 1 + high).detach() * a * lp_i
        else:
            tok = -torch.minimum(ratio * a, torch.clamp(ratio, 1 - low, 1 + high) * a)
            if clip_c is not None and a < 0:
                tok = torch.minimum(tok, torch.full_like(tok, -clip_c * a))
        per_seq.append(tok)
    n = len(per_seq)
    if agg == "token-mean":
        return torch.cat(per_seq).sum() / sum(t.numel() for t in per_seq)
    if agg == "seq-mean-token-mean":
        return sum((t.mean() for t in per_seq), torch.tensor(0.0)) / n
    total = sum((t.sum() for t in per_seq), torch.tensor(0.0))
    return total / n if agg == "seq-mean-token-sum" else total / (n * NORM)


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[4]}" for c in CASES])
def test_the_engine_step_is_the_formula(case: tuple[Any, ...], model_dir: Path, samples: list[Sample]) -> None:
    import transformers

    mode, low, high, clip_c, agg = case
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    lp = [hf_logprobs(hf, s) for s in samples]
    old = [torch.tensor(s.old_logprobs or []) for s in samples]
    want = formula_loss(lp, old, advantages(samples), case)
    want.backward()
    want_norm = math.sqrt(sum(float(p.grad.pow(2).sum()) for p in hf.parameters() if p.grad is not None))
    ratios = torch.exp(torch.cat(lp).detach() - torch.cat(old))
    assert ((ratios < 1 - low) | (ratios > 1 + high)).any()  # some token lies outside the clip range
    if clip_c is not None:
        adv = torch.cat([torch.full((len(o),), a) for o, a in zip(old, advantages(samples), strict=True)])
        assert ((adv < 0) & (ratios > clip_c)).any()  # and the dual-clip bound holds some

    for share, rows_per_micro in ((False, 0), (False, 1), (True, 1)):
        algo = GRPO(kl_coef=0.0, policy_loss=mode, clip=low, clip_high=high, clip_c=clip_c, reduction=agg,
                    agg_norm=NORM, share_prompts=share)
        batch = algo.prepare(samples, row_budget(samples, share_prompts=share))
        assert (batch.prefix_ids is not None) == share

        def loss_fn(out: torch.Tensor, mb: Any, algo: GRPO = algo) -> tuple[torch.Tensor, dict[str, float]]:
            return algo.loss(shift_to_labels(out), mb)

        engine = MegatronEngine.from_hf(model_dir, lr=1e-2, seed=0)
        got = engine.train_step(batch, loss_fn, micro_batch_size=rows_per_micro or batch.num_rows, reduction="sum")
        layout = f"share_prompts={share}, rows per micro-batch {rows_per_micro or batch.num_rows}"
        assert got["loss"] == pytest.approx(float(want.detach()), abs=2e-5), layout
        assert got["grad_norm"] == pytest.approx(want_norm, rel=2e-4), layout
