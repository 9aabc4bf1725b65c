"""Sequence packing: row layout, boundaries, masks, alignment and round trips."""

from __future__ import annotations

import random

import pytest
import torch

from tandem.sidecars.algorithms.packing import PackingError, pack, plan_rows, token_logprobs

PAD = 0


@pytest.fixture()
def small() -> tuple[list[list[int]], list[list[int]]]:
    return [[1, 2], [6], [8, 9, 10]], [[3, 4, 5], [7], [11, 12]]


def test_first_fit_decreasing_layout(small: tuple[list[list[int]], list[list[int]]]) -> None:
    prompts, comps = small
    b = pack(prompts, comps, token_budget=7, pad_id=PAD)
    # lengths 5, 2, 5: FFD puts 0 then 2 (new row), then 1 into row 0's free 2 tokens
    assert b.num_rows == 2 and b.row_length == 7
    assert b.input_ids.tolist() == [[1, 2, 3, 4, 5, 6, 7], [8, 9, 10, 11, 12, PAD, PAD]]
    assert b.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1], [0, 1, 2, 3, 4, 0, 0]]
    assert b.segment_ids.tolist() == [[1, 1, 1, 1, 1, 2, 2], [1, 1, 1, 1, 1, 0, 0]]
    # labels: next token inside the same sequence, pad at each sequence's last position
    assert b.labels.tolist() == [[2, 3, 4, 5, PAD, 7, PAD], [9, 10, 11, 12, PAD, PAD, PAD]]
    # loss on positions whose NEXT token is a completion token
    assert b.loss_mask.tolist() == [[0, 1, 1, 1, 0, 1, 0], [0, 0, 1, 1, 0, 0, 0]]
    assert b.seq_index.tolist() == [[0, 0, 0, 0, 0, 1, 1], [2, 2, 2, 2, 2, -1, -1]]
    assert b.cu_seqlens().tolist() == [0, 5, 7, 12, 14]
    assert b.max_seqlen() == 5
    # every masked label is a completion token
    sel = b.loss_mask > 0
    assert sorted(b.labels[sel].tolist()) == [3, 4, 5, 7, 11, 12]


def test_attention_mask_blocks_other_sequences(small: tuple[list[list[int]], list[list[int]]]) -> None:
    b = pack(*small, token_budget=7)
    m = b.attention_mask()
    assert m.shape == (2, 1, 7, 7)
    row0 = m[0, 0]
    assert row0[4, :5].all() and not row0[4, 5:].any()  # causal within seq 1
    assert row0[6].tolist() == [False] * 5 + [True, True]  # seq 2 sees only itself
    assert not row0[0, 1]  # no peeking ahead
    assert m[1, 0, 6].tolist() == [False] * 6 + [True]  # padding attends only to itself


def test_scatter_unpack_alignment(small: tuple[list[list[int]], list[list[int]]]) -> None:
    b = pack(*small, token_budget=7)
    per = [[0.3, 0.4, 0.5], [0.7], [1.1, 1.2]]
    t = b.scatter(per)
    assert t.tolist()[0] == pytest.approx([0, 0.3, 0.4, 0.5, 0, 0.7, 0])
    assert (t != 0).float().eq(b.loss_mask).all()
    back = b.unpack(t)
    assert {k: pytest.approx(v.tolist()) for k, v in back.items()} == dict(enumerate(per))
    with pytest.raises(PackingError):
        b.scatter([[0.1], [0.7], [1.1, 1.2]])


def test_logprob_alignment_matches_unpacked_forward() -> None:
    torch.manual_seed(0)
    vocab = 11
    prompts, comps = [[1, 2], [3]], [[4, 5, 6], [7, 8]]
    b = pack(prompts, comps, token_budget=16)
    logits = torch.randn(b.num_rows, b.row_length, vocab)
    lp = token_logprobs(logits, b.labels)
    for p in b.placements:
        ids = prompts[p.sample] + comps[p.sample]
        for j, tok in enumerate(comps[p.sample]):
            pos = p.start + p.prompt_len + j - 1  # logits at t predict token t+1
            want = torch.log_softmax(logits[p.row, pos], -1)[tok]
            assert b.unpack(lp)[p.sample][j].item() == pytest.approx(want.item())
            assert ids[pos - p.start + 1] == tok


def test_unpack_pack_roundtrip_random() -> None:
    rng = random.Random(7)
    prompts = [[rng.randrange(1, 50) for _ in range(rng.randint(1, 9))] for _ in range(40)]
    comps = [[rng.randrange(1, 50) for _ in range(rng.randint(0, 12))] for _ in range(40)]
    b = pack(prompts, comps, token_budget=32, pad_to_multiple=8)
    assert b.row_length % 8 == 0 and b.row_length <= 32
    assert b.unpack_tokens() == {i: (prompts[i], comps[i]) for i in range(40)}
    assert int(b.loss_mask.sum()) == sum(len(c) for c in comps)
    assert int((b.segment_ids > 0).sum()) == sum(len(p) + len(c) for p, c in zip(prompts, comps, strict=True))
    # rows are never over budget and pieces never overlap
    for r in range(b.num_rows):
        spans = sorted((p.start, p.start + p.length) for p in b.placements if p.row == r)
        assert all(a[1] <= c[0] for a, c in zip(spans, spans[1:], strict=False))
        assert spans[-1][1] <= 32


def test_split_keeps_everything() -> None:
    rng = random.Random(3)
    prompts = [[1] * rng.randint(1, 5) for _ in range(10)]
    comps = [[2] * rng.randint(1, 5) for _ in range(10)]
    b = pack(prompts, comps, token_budget=10)
    parts = b.split(3)
    assert sum(p.num_rows for p in parts) == b.num_rows
    got = {}
    for part in parts:
        got.update(part.unpack_tokens())
        assert all(0 <= p.row < part.num_rows for p in part.placements)
        assert int(part.seq_index.max()) == len(part.placements) - 1
    assert got == b.unpack_tokens()


def test_units_share_a_row_and_errors() -> None:
    b = pack([[1], [2], [3], [4]], [[5, 5], [6], [7, 7, 7], [8]], 6, units=[[0, 1], [2, 3]])
    rows = {p.sample: p.row for p in b.placements}
    assert rows[0] == rows[1] and rows[2] == rows[3]
    with pytest.raises(PackingError):
        pack([[1]], [[2] * 10], 5)
    with pytest.raises(PackingError):
        pack([[]], [[2]], 5)
    with pytest.raises(PackingError):
        pack([[1], [2]], [[3], [4]], 5, units=[[0]])
    assert plan_rows([3, 3, 3, 1], 4) == [[0, 3], [1], [2]]
