"""DAPO's dynamic sampling (`tandem.sidecars.trainer.loop.rollout.dynamic_sampling.fill`) with the driver's own
sample conversion (`sources.to_samples`) and the job's real reward combiner (answerMatch): groups whose
rewards all tie are dropped, rounds are generated until the batch is full or the rounds run out, the
kept groups' rewards stay aligned with their samples, and a batch with nothing informative trains as
it came."""

from __future__ import annotations

from collections.abc import Iterator

from tandem.sidecars.algorithms.algorithm_interface import Sample
from tandem.sidecars.rewards.combine import RewardInput, RewardSet
from tandem.sidecars.trainer.loop.data.dataset import Prompt
from tandem.sidecars.trainer.loop.rollout.dynamic_sampling import fill, informative
from tandem.sidecars.trainer.loop.rollout.partial import Group, Pending, Segment
from tandem.sidecars.trainer.loop.rollout.sources import to_samples
from tandem.spec.rewards import Reward

ANSWER = 7


def group(index: int, correct: int, size: int = 4) -> Group:
    """A prompt whose first `correct` of `size` completions answer it right."""
    members = [Pending([1, 2], [3 + i], [-0.5], [Segment(0, 1)],
                       f"<answer>{ANSWER if i < correct else 0}</answer>", "stop", done=True) for i in range(size)]
    return Group(Prompt(f"q{index}", str(ANSWER), index), members, born=0)


def samples_of(groups: list[Group]) -> tuple[list[Sample], list[RewardInput]]:
    return to_samples(groups, eos_id=0, decode=lambda ids: "")


SCORE = RewardSet([Reward(type="answerMatch")]).score


def rounds(*batches: list[Group]) -> Iterator[list[Group]]:
    yield from batches


def test_flat_groups_are_dropped_and_rounds_refill_the_batch() -> None:
    first = [group(0, 4), group(1, 2), group(2, 0), group(3, 1)]  # two informative
    extra = rounds([group(4, 0), group(5, 3)], [group(6, 1), group(7, 2), group(8, 4)])
    asked: list[int] = []

    def more(r: int) -> list[Group]:
        asked.append(r)
        return next(extra)

    got = fill(first, more, samples_of, SCORE, want=4, max_rounds=3)
    assert asked == [1, 2]
    assert [g.prompt.index for g in got.groups] == [1, 3, 5, 6]  # the first four informative, in order
    assert got.stats == {"dynamic_rounds": 3, "dynamic_kept_groups": 4, "dynamic_dropped_groups": 4,
                         "dynamic_full": True, "dynamic_dropped_frac": 0.5}
    assert [s.group for s in got.samples] == [g for g in range(4) for _ in range(4)]
    assert got.rewards == [1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    assert got.rewards == SCORE(got.inputs)[0]  # aligned with the samples they belong to
    assert all(informative(got.rewards[i:i + 4]) for i in range(0, 16, 4))


def test_short_after_the_last_round_it_trains_on_what_it_kept() -> None:
    got = fill([group(0, 4), group(1, 1)], lambda r: [group(2, 0), group(3, 0)], samples_of, SCORE, want=4,
               max_rounds=2)
    assert [g.prompt.index for g in got.groups] == [1] and got.stats["dynamic_full"] is False
    assert got.stats["dynamic_rounds"] == 2 and got.stats["dynamic_dropped_groups"] == 3


def test_nothing_informative_trains_on_the_first_round_as_it_came() -> None:
    first = [group(0, 4), group(1, 0)]
    got = fill(first, lambda r: [group(2, 4)], samples_of, SCORE, want=2, max_rounds=2)
    assert got.groups == first and got.rewards == [1.0] * 4 + [0.0] * 4
    assert got.stats["dynamic_kept_groups"] == 0 and got.stats["dynamic_rounds"] == 2
