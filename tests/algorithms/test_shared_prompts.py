"""Shared prompts in packing: a group's prompt held once per row, layout, masks, budgets, round trips.

The equality of log-probs and gradients with one copy per completion, on real megatron-core, is in
tests/trainer/test_shared_prompts_engine.py.
"""

from __future__ import annotations

import random

import pytest
import torch

from tandem.sidecars.algorithms.algorithm_interface import Sample, pack_samples, prompt_groups, row_budget
from tandem.sidecars.algorithms.dpo import DPO
from tandem.sidecars.algorithms.grpo import GRPO
from tandem.sidecars.algorithms.packing import PackingError, pack, token_logprobs

PAD = 0


def test_group_layout_positions_and_loss_mask() -> None:
    b = pack([[1, 2, 3], [1, 2, 3]], [[4, 5], [6]], token_budget=16, units=[[0, 1]], share_prompts=True)
    assert b.num_rows == 1 and b.row_length == 7  # 2 prefix + (1 + 2) + (1 + 1), not 5 + 4
    assert b.input_ids.tolist() == [[1, 2, 3, 4, 5, 3, 6]]
    assert b.position_ids.tolist() == [[0, 1, 2, 3, 4, 2, 3]]  # each sample continues the prefix
    assert b.segment_ids.tolist() == [[1, 1, 2, 2, 2, 3, 3]]
    assert b.prefix_ids is not None and b.prefix_ids.tolist() == [[0, 0, 1, 1, 1, 1, 1]]
    assert b.labels.tolist() == [[2, PAD, 4, 5, PAD, 6, PAD]]
    assert b.loss_mask.tolist() == [[0, 0, 1, 1, 0, 1, 0]]  # the prompt's last token predicts each first token
    assert b.seq_index.tolist() == [[-1, -1, 0, 0, 0, 1, 1]]
    assert b.unpack_tokens() == {0: ([1, 2, 3], [4, 5]), 1: ([1, 2, 3], [6])}
    assert b.unpack(b.scatter([[0.4, 0.5], [0.6]])) == {0: pytest.approx([0.4, 0.5]), 1: pytest.approx([0.6])}
    with pytest.raises(PackingError, match="THD"):
        b.cu_seqlens()


def test_each_sample_sees_the_prefix_and_itself_only() -> None:
    b = pack([[1, 2, 3], [1, 2, 3]], [[4, 5], [6]], token_budget=16, units=[[0, 1]], share_prompts=True)
    m = b.attention_mask()[0, 0]
    assert m[4].tolist() == [True, True, True, True, True, False, False]  # sample 0's last token
    assert m[6].tolist() == [True, True, False, False, False, True, True]  # sample 1: prefix + itself
    assert m[1].tolist() == [True, True] + [False] * 5  # the prefix sees no sample


def test_no_sharing_without_a_common_prompt_or_alone() -> None:
    b = pack([[1, 2], [1, 3], [7, 8]], [[4], [5], [6]], token_budget=16, units=[[0, 1], [2]], share_prompts=True)
    assert b.prefix_ids is None
    assert b.unpack_tokens() == {0: ([1, 2], [4]), 1: ([1, 3], [5]), 2: ([7, 8], [6])}
    single = pack([[9], [9]], [[1, 2], [3]], token_budget=16, units=[[0, 1]], share_prompts=True)
    assert single.prefix_ids is None  # a one-token prompt has nothing to share: its token predicts


def test_a_group_over_the_budget_is_split_into_sub_units() -> None:
    prompt = list(range(1, 9))  # 8 tokens: the prefix is 7
    comps = [[20] * 5, [21] * 5, [22] * 5]
    b = pack([prompt] * 3, comps, token_budget=20, units=[[0, 1, 2]], share_prompts=True)
    # 7 + 6 + 6 = 19 fits; a third member would make 25: it goes with a prefix of its own
    assert b.num_rows == 2 and b.row_length <= 20
    assert {p.sample: p.row for p in b.placements} == {0: 0, 1: 0, 2: 1}
    assert b.unpack_tokens() == {i: (prompt, comps[i]) for i in range(3)}
    assert int(b.loss_mask.sum()) == 15


def test_random_groups_round_trip_split_and_token_count() -> None:
    rng = random.Random(11)
    samples = []
    for g in range(12):
        prompt = [rng.randrange(1, 90) for _ in range(rng.randint(1, 12))]
        samples += [Sample(prompt, [rng.randrange(1, 90) for _ in range(rng.randint(0, 9))], group=g)
                    for _ in range(rng.randint(1, 5))]
    rng.shuffle(samples)  # members of a group need not be adjacent
    budget = row_budget(samples, share_prompts=True)
    shared = pack_samples(samples, budget, share_prompts=True)
    whole = pack_samples(samples, budget)
    assert shared.unpack_tokens() == whole.unpack_tokens()
    assert int(shared.loss_mask.sum()) == int(whole.loss_mask.sum())
    saved = sum((len(samples[g[0]].prompt_ids) - 1) * (len(g) - 1) for g in prompt_groups(samples)
                if len(samples[g[0]].prompt_ids) > 1)
    assert int((shared.segment_ids > 0).sum()) == int((whole.segment_ids > 0).sum()) - saved
    parts = shared.split(3)
    got: dict[int, tuple[list[int], list[int]]] = {}
    for part in parts:
        got.update(part.unpack_tokens())
        assert part.prefix_ids is not None and part.prefix_ids.shape == part.input_ids.shape
    assert got == whole.unpack_tokens()


def test_row_budget_fits_a_group_up_to_the_cap() -> None:
    group = [Sample([1] * 40, [2] * 30, group=0) for _ in range(4)]
    assert row_budget(group) == 128  # the longest sample (70), rounded to 64
    assert row_budget(group, share_prompts=True) == 192  # 39 + 4 x 31 = 163: the whole group in a row
    big = [Sample([1] * 40, [2] * 600, group=0) for _ in range(8)]
    assert row_budget(big, share_prompts=True) == 1024  # capped: the group is split over rows
    assert row_budget(big, share_prompts=True, hidden=8192) == 1024
    # a narrow model: dense attention over a long row would cost more than sharing saves
    assert row_budget(group, share_prompts=True, hidden=576) == 192  # SmolLM2: the group fits under 288
    assert row_budget(group, share_prompts=True, hidden=64) == 128  # no growth: sub-units within 128


def test_logprobs_of_shared_rows_equal_whole_rows_with_an_exact_causal_model() -> None:
    """A toy model whose logits at t depend on every visible earlier token (a masked sum of
    embeddings): the same log-probs through the shared layout and the whole one."""
    torch.manual_seed(0)
    vocab, dim = 50, 8
    emb, pos, out = torch.randn(vocab, dim), torch.randn(64, dim), torch.randn(dim, vocab)

    def logits(b: object) -> torch.Tensor:
        x = emb[b.input_ids] + pos[b.position_ids]  # type: ignore[attr-defined]
        mask = b.attention_mask()[:, 0].float()  # type: ignore[attr-defined]
        return torch.einsum("rts,rsd->rtd", mask, x) @ out

    samples = [Sample([5, 6, 7, 8], [9, 10, 11], group=0), Sample([5, 6, 7, 8], [12], group=0),
               Sample([5, 6, 7, 8], [13, 14], group=0), Sample([3, 4], [15, 16], group=1),
               Sample([3, 4], [17], group=1)]
    shared = pack_samples(samples, 64, share_prompts=True)
    whole = pack_samples(samples, 64)
    a = shared.unpack(token_logprobs(logits(shared), shared.labels))
    b = whole.unpack(token_logprobs(logits(whole), whole.labels))
    assert a.keys() == b.keys()
    for i in a:
        assert torch.allclose(a[i], b[i], atol=1e-5), i


def test_algorithms_prepare_with_shared_prompts() -> None:
    samples = [Sample([1, 2, 3], [4, 5], group=0, reward=1.0, rollout_logprobs=[-0.1, -0.2]),
               Sample([1, 2, 3], [6], group=0, reward=0.0, rollout_logprobs=[-0.3]),
               Sample([7, 8], [9], group=1, reward=0.5, rollout_logprobs=[-0.4]),
               Sample([7, 8], [10, 11], group=1, reward=0.0, rollout_logprobs=[-0.5, -0.6])]
    batches = [GRPO(kl_coef=0.0, share_prompts=flag).prepare(samples, 64) for flag in (False, True)]
    assert batches[0].prefix_ids is None and batches[1].prefix_ids is not None
    per_sample = []
    for batch in batches:
        assert float(batch.weights.sum()) == pytest.approx(1.0)  # type: ignore[union-attr]
        per_sample.append({name: {i: v.tolist() for i, v in batch.unpack(t).items()}
                           for name, t in [*batch.token_fields.items(), ("weights", batch.weights)]})
    assert per_sample[0] == per_sample[1]  # advantages, rollout log-probs and loss weights per token
    assert per_sample[1]["advantages"][0][0] > 0 > per_sample[1]["advantages"][1][0]
    ref = [Sample(s.prompt_ids, s.completion_ids, s.group, s.reward, ref_logprobs=[-1.0] * len(s.completion_ids))
           for s in samples]
    pairs = DPO(share_prompts=True).prepare(ref, 64)
    assert pairs.prefix_ids is not None and {p.sample for p in pairs.placements} == {0, 1, 2, 3}
    assert all(p.shared > 0 for p in pairs.placements)
