"""Partial rollouts' bookkeeping (`tandem.sidecars.trainer.loop.rollout.partial`) with a scripted engine.

`Script` stands in for the rollouts' generate: every member of a prompt's group has a natural
length; a request yields min(limit, what is left) tokens and says "stop" when the answer ended,
"length" when the limit cut it. Its tokens name the member, so a continuation (prompt + tokens so
far) is recognised. The tests assert what the engine was asked (inputs, per-request limits) and
what PartialRollouts keeps (segments, versions, log-probs, carried and dropped groups). The real
engine continuing a completion across a version change is tests/rollout_engine/test_partial_continuation.py.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest

from tandem.sidecars.rollout_engine.sampling import Completion
from tandem.sidecars.trainer.loop.data.dataset import Prompt
from tandem.sidecars.trainer.loop.rollout.partial import (
    Group,
    PartialRollouts,
    Pending,
    Segment,
    staleness_stats,
    whole_groups,
)

TOKEN = 10_000  # generated token ids are TOKEN + member uid (uid = 100 * prompt + member)


def prompt(index: int) -> Prompt:
    return Prompt(text=f"q{index}", answer=None, index=index, token_ids=[index])


def lp(version: int) -> float:
    return -0.1 * (version + 1)  # each version samples with its own log-prob: segments stay tellable apart


class Script:
    """A rollout engine whose completions have scripted lengths: lengths[prompt][member]."""

    def __init__(self, lengths: dict[int, list[int]]):
        self.lengths = lengths
        self.version = 0
        self.calls: list[tuple[list[list[int]], list[int]]] = []
        self._started: Counter[int] = Counter()

    def __call__(self, inputs: list[str | list[int]], limits: list[int]) -> tuple[list[Completion], int]:
        assert all(isinstance(x, list) for x in inputs)
        ids_in = [list(x) for x in inputs if isinstance(x, list)]
        self.calls.append((ids_in, list(limits)))
        out = []
        for inp, limit in zip(ids_in, limits, strict=True):
            if len(inp) == 1:  # a fresh prompt: the next member of its group
                p = inp[0]
                uid = 100 * p + self._started[p]
                self._started[p] += 1
            else:  # a continuation: the prompt, then this member's tokens
                uid = inp[-1] - TOKEN
                assert inp[1:] == [TOKEN + uid] * (len(inp) - 1)
            target = self.lengths[uid // 100][uid % 100]
            left = target - (len(inp) - 1)
            n = min(limit, left)
            out.append(Completion(prompt_index=0, sample_index=0, prompt_token_ids=inp, token_ids=[TOKEN + uid] * n,
                                  logprobs=[lp(self.version)] * n, text=f"text{uid}",
                                  finish_reason="stop" if n == left else "length"))
        return out, self.version


def member_ids(uid: int, n: int) -> list[int]:
    return [TOKEN + uid] * n


def test_cut_completions_are_carried_and_continued_under_newer_weights() -> None:
    engine = Script({0: [2, 3], 1: [3, 12], 2: [1, 1]})
    pr = PartialRollouts(token_budget=4, max_tokens=10, max_age=5, group_size=2)

    engine.version = 0
    out = pr.step(engine, [prompt(0), prompt(1)], 0)
    assert engine.calls == [([[0], [0], [1], [1]], [4, 4, 4, 4])]
    assert [g.prompt.index for g in out.finished] == [0]  # group 1 waits for its cut member
    assert pr.inflight() == [1]
    assert out.stats["partial_rounds"] == 1  # a group finished: no second round
    assert (out.stats["carried_in"], out.stats["carried_out"], out.stats["carried_groups"]) == (0, 1, 1)
    g1 = pr.carried[0]
    assert g1.members[0].done and g1.members[0].finish_reason == "stop"  # stopped before the budget
    assert not g1.members[1].done and g1.members[1].finish_reason == "length"

    engine.version = 1
    out = pr.step(engine, [prompt(2)], 1)
    # the cut member continues from prompt + its 4 tokens, with the budget as its limit
    assert engine.calls[1] == ([[1, *member_ids(101, 4)], [2], [2]], [4, 4, 4])
    assert [g.prompt.index for g in out.finished] == [2]
    assert out.stats["carried_in"] == 1 and pr.inflight() == [1]

    engine.version = 2
    out = pr.step(engine, [], 2)
    # 8 tokens so far: the limit is what maxTokens leaves (2), below the budget
    assert engine.calls[2] == ([[1, *member_ids(101, 8)]], [2])
    assert [g.prompt.index for g in out.finished] == [1] and pr.inflight() == []
    short, long_ = out.finished[0].members
    assert long_.done and long_.finish_reason == "length"  # cut by maxTokens: finished all the same
    assert long_.token_ids == member_ids(101, 10)
    assert long_.prompt_ids == [1]  # the original prompt, not the continuation's
    assert long_.segments == [Segment(0, 4), Segment(1, 4), Segment(2, 2)]
    assert long_.versions() == [0] * 4 + [1] * 4 + [2] * 2
    assert long_.logprobs == [lp(0)] * 4 + [lp(1)] * 4 + [lp(2)] * 2
    assert long_.text == ""  # several segments: the caller decodes all tokens
    assert short.segments == [Segment(0, 3)] and short.text == "text100" and short.token_ids == member_ids(100, 3)
    assert out.finished[0].born == 0
    st = staleness_stats(out.finished, 2)
    assert st["staleness_hist"] == {"2": 2}  # both began under version 0
    assert st["carried_share"] == 0.5


def test_stop_exactly_at_the_budget_finishes() -> None:
    engine = Script({0: [4]})
    pr = PartialRollouts(token_budget=4, max_tokens=10, max_age=5, group_size=1)
    out = pr.step(engine, [prompt(0)], 0)
    assert len(out.finished) == 1 and pr.carried == []
    assert out.finished[0].members[0].finish_reason == "stop"


def test_rounds_repeat_under_the_same_weights_only_while_no_group_finished() -> None:
    engine = Script({0: [3, 9]})
    pr = PartialRollouts(token_budget=4, max_tokens=10, max_age=5, group_size=2)
    engine.version = 7
    out = pr.step(engine, [prompt(0)], 7)
    assert [limits for _, limits in engine.calls] == [[4, 4], [4], [2]]
    assert engine.calls[1][0] == [[0, *member_ids(1, 4)]] and engine.calls[2][0] == [[0, *member_ids(1, 8)]]
    assert out.stats["partial_rounds"] == 3
    m = out.finished[0].members[1]
    assert m.segments == [Segment(7, 4), Segment(7, 4), Segment(7, 1)] and m.finish_reason == "stop"

    once = Script({0: [3, 9]})
    pr = PartialRollouts(token_budget=4, max_tokens=10, max_age=5, group_size=2)
    out = pr.step(once, [prompt(0)], 0, until_finished=False)
    assert len(once.calls) == 1 and out.finished == [] and pr.inflight() == [0]


def test_groups_older_than_max_age_are_dropped_and_their_tokens_counted() -> None:
    engine = Script({0: [3, 20], 1: [1]})
    pr = PartialRollouts(token_budget=3, max_tokens=30, max_age=1, group_size=2)
    pr.step(engine, [prompt(0)], 0, until_finished=False)  # 3 (stopped) + 3 (cut)
    engine.version = 1
    out = pr.step(engine, [], 1, until_finished=False)  # one version old: kept, 3 more
    assert out.stats["dropped_completions"] == 0 and out.stats["carried_in"] == 1
    assert engine.calls[1] == ([[0, *member_ids(1, 3)]], [3])
    engine.version = 2
    pr.group_size = 1
    out = pr.step(engine, [prompt(1)], 2)  # two versions old > maxAge 1: dropped before generating
    assert engine.calls[2] == ([[1]], [3])  # nothing of prompt 0 is generated
    assert out.stats["dropped_completions"] == 2
    assert out.stats["wasted_tokens"] == 3 + 6  # the finished member's tokens are wasted too
    assert out.stats["carried_in"] == 0
    assert [g.prompt.index for g in out.finished] == [1] and pr.inflight() == []


def test_carried_groups_exactly_max_age_old_are_kept() -> None:
    engine = Script({0: [9]})
    pr = PartialRollouts(token_budget=2, max_tokens=10, max_age=2, group_size=1)
    pr.step(engine, [prompt(0)], 0, until_finished=False)
    engine.version = 2
    out = pr.step(engine, [], 2, until_finished=False)
    assert out.stats["dropped_completions"] == 0 and pr.inflight() == [0]
    engine.version = 3
    out = pr.step(engine, [], 3, until_finished=False)
    assert out.stats["dropped_completions"] == 1 and out.stats["wasted_tokens"] == 4 and pr.inflight() == []


def test_inflight_lists_the_carried_prompt_indexes() -> None:
    engine = Script({3: [9], 5: [1], 8: [9]})
    pr = PartialRollouts(token_budget=2, max_tokens=10, max_age=5, group_size=1)
    out = pr.step(engine, [prompt(3), prompt(5), prompt(8)], 0)
    assert [g.prompt.index for g in out.finished] == [5]
    assert pr.inflight() == [3, 8]


def member(*segments: tuple[int, int]) -> Pending:
    n = sum(t for _, t in segments)
    return Pending(prompt_ids=[1], token_ids=[2] * n, logprobs=[-1.0] * n,
                   segments=[Segment(v, t) for v, t in segments], done=True)


def test_staleness_stats_by_hand() -> None:
    groups = [
        Group(prompt(0), [member((5, 3)), member((3, 2), (4, 2), (5, 1))], born=3),
        Group(prompt(1), [member((4, 4)), member((3, 1), (5, 1))], born=3),
    ]
    st = staleness_stats(groups, 5)
    assert st["staleness_hist"] == {"0": 1, "1": 1, "2": 2}
    assert list(st["staleness_hist"]) == ["0", "1", "2"]  # sorted by age
    assert st["staleness_mean"] == pytest.approx((0 + 2 + 1 + 2) / 4)
    assert st["staleness_max"] == 2
    assert st["carried_share"] == pytest.approx(2 / 4)
    empty = staleness_stats([], 5)
    assert empty == {"staleness_hist": {}, "staleness_mean": 0.0, "staleness_max": 0, "carried_share": 0.0}


def test_whole_groups_are_finished_single_segment_groups() -> None:
    c = Completion(prompt_index=0, sample_index=0, prompt_token_ids=[1, 2], token_ids=[3, 4, 5],
                   logprobs=[-1.0, -2.0, -3.0], text="abc", finish_reason="stop")
    (g,) = whole_groups([prompt(4)], [[c, c]], 6)
    assert g.done and g.born == 6 and g.tokens == 6 and g.prompt.index == 4
    assert all(m.segments == [Segment(6, 3)] and m.text == "abc" and m.prompt_ids == [1, 2] for m in g.members)


def test_missing_logprobs_become_nan_per_token() -> None:
    def generate(inputs: list[str | list[int]], limits: list[int]) -> tuple[list[Completion], int]:
        return [Completion(prompt_index=0, sample_index=0, prompt_token_ids=[0], token_ids=[5, 6], logprobs=[],
                           text="x", finish_reason="stop")], 0

    pr = PartialRollouts(token_budget=4, max_tokens=10, max_age=5, group_size=1)
    (m,) = pr.step(generate, [prompt(0)], 0).finished[0].members
    assert len(m.logprobs) == 2 and all(math.isnan(x) for x in m.logprobs)


def test_generate_returning_the_wrong_count_or_version_is_an_error() -> None:
    engine = Script({0: [3, 3]})

    def too_few(inputs: list[str | list[int]], limits: list[int]) -> tuple[list[Completion], int]:
        got, v = engine(inputs, limits)
        return got[:1], v

    pr = PartialRollouts(token_budget=4, max_tokens=10, max_age=5, group_size=2)
    with pytest.raises(RuntimeError, match="1 completions for 2 requests"):
        pr.step(too_few, [prompt(0)], 0)
    engine = Script({0: [3, 3]})
    engine.version = 3
    pr = PartialRollouts(token_budget=4, max_tokens=10, max_age=5, group_size=2)
    with pytest.raises(RuntimeError, match="version 3, expected 4"):
        pr.step(engine, [prompt(0)], 4)


@pytest.mark.parametrize("budget", [0, 10, 11])
def test_token_budget_must_lie_below_max_tokens(budget: int) -> None:
    with pytest.raises(ValueError, match="token_budget"):
        PartialRollouts(token_budget=budget, max_tokens=10, max_age=5, group_size=2)
