"""Multi-turn completions: tokens the environment wrote (tool results) are context, not trained.
`Sample.completion_mask` keeps them out of the packed loss mask, so every loss (GRPO's and PPO's, each
aggregation), its gradient and the rollout-mismatch metrics ignore them."""

from __future__ import annotations

import pytest

from tandem.sidecars.algorithms.algorithm_interface import Sample, pack_samples
from tandem.sidecars.algorithms.grpo import GRPO
from tandem.sidecars.algorithms.packing import PackingError


def _samples(mask: bool) -> list[Sample]:
    # completion of sample 0: model 3 tokens, environment 2, model 2 (a tool turn in the middle)
    m0 = [1, 1, 1, 0, 0, 1, 1] if mask else None
    return [Sample([5, 6], [7, 8, 9, 10, 11, 12, 13], group=0, reward=1.0, completion_mask=m0,
                   old_logprobs=[-1.0] * 7, rollout_logprobs=[-1.0, -1.0, -1.0, 0.0, 0.0, -1.0, -1.0]),
            Sample([5, 6], [14, 15], group=0, reward=0.0, old_logprobs=[-0.5] * 2, rollout_logprobs=[-0.5] * 2)]


def test_the_environments_tokens_leave_the_loss_mask() -> None:
    batch = pack_samples(_samples(True), 64)
    assert batch.loss_mask.sum().item() == 5 + 2
    unpacked = batch.unpack(batch.loss_mask)  # labels layout: the mask of each completion token
    assert unpacked[0].tolist() == [1, 1, 1, 0, 0, 1, 1] and unpacked[1].tolist() == [1, 1]
    with pytest.raises(PackingError, match="completion mask has 2 entries for 7 tokens"):
        pack_samples([Sample([1], [2] * 7, group=0, completion_mask=[1, 0])], 64)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_losses_and_gradients_ignore_masked_tokens(agg: str) -> None:
    algo = GRPO(kl_coef=0.0, tis_cap=2.0, reduction=agg)  # type: ignore[arg-type]
    batch = algo.prepare(_samples(True), 64)
    lp = batch.token_fields["old_logprobs"].clone().requires_grad_(True)
    loss, metrics = algo.loss(lp, batch)
    loss.backward()
    assert lp.grad is not None
    masked = (batch.loss_mask == 0) & (batch.seq_index >= 0)  # completion and prompt positions outside the mask
    assert lp.grad[masked].abs().max().item() == 0.0
    assert lp.grad[batch.loss_mask > 0].abs().max().item() > 0
    assert metrics["mismatch_max"] == pytest.approx(0.0)  # the environment's 0.0 "log-probs" are not compared
    # whatever the log-probs of the environment's tokens, the loss is the same
    moved = lp.detach().clone()
    moved[masked] -= 3.0
    again, _ = algo.loss(moved, batch)
    assert again.item() == pytest.approx(loss.item())
    # ... and a mask of all ones would train them: the mask is what keeps them out
    unmasked = algo.prepare(_samples(False), 64)
    assert unmasked.loss_mask.sum().item() == 9
