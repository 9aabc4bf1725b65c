"""DAPO's dynamic sampling: groups whose completions all scored the same carry no signal under a
group baseline, so they are dropped and more prompts are generated until the batch is full again.

Role: `fill` scores each generation round's groups with the job's rewards, keeps the informative ones
(rewards not all equal) up to `want` groups, and asks for another round while the batch is short and
rounds remain (`algorithm.dynamicSampling.maxRounds`, the first round included). When the rounds run
out short, the iteration trains on what it kept; when nothing was informative, on the first round
as it came (its advantages are 0: the KL term alone moves the policy). The rewards computed here are
the iteration's (`inference.inference` does not score again). Caller: the Rollout phase (`phases.generate.rollout`)
(`tandem.sidecars.trainer.loop.driver`), with the synchronous source's `more` for the extra rounds.
Reported per iteration: dynamic_rounds, dynamic_kept_groups, dynamic_dropped_groups, dynamic_full and
dynamic_dropped_frac (the share of the groups it judged that it dropped).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tandem.sidecars.algorithms.algorithm_interface import Sample
from tandem.sidecars.rewards.combine import RewardInput
from tandem.sidecars.trainer.loop.rollout.partial import Group

Scores = tuple[list[float], dict[str, list[float]]]  # per sample: totals, and each component


@dataclass
class Filled:
    groups: list[Group]
    samples: list[Sample]
    inputs: list[RewardInput]
    rewards: list[float]
    components: dict[str, list[float]] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)


def informative(rewards: Sequence[float], tolerance: float = 1e-9) -> bool:
    """A group whose rewards differ: its group-relative advantages are not all 0."""
    return bool(rewards) and max(rewards) - min(rewards) > tolerance


def fill(first: list[Group], more: Callable[[int], list[Group]],
         to_samples: Callable[[list[Group]], tuple[list[Sample], list[RewardInput]]],
         score: Callable[[list[RewardInput]], Scores], want: int, max_rounds: int) -> Filled:
    kept: list[tuple[Group, list[float], dict[str, list[float]]]] = []
    first_round: Filled | None = None
    dropped, rounds, groups = 0, 0, first
    while True:
        rounds += 1
        samples, inputs = to_samples(groups)
        totals, components = score(inputs)
        if first_round is None:
            first_round = Filled(groups, samples, inputs, totals, components)
        at = 0
        for g in groups:
            n = len(g.members)
            part = totals[at:at + n]
            if informative(part) and len(kept) < want:
                kept.append((g, part, {k: v[at:at + n] for k, v in components.items()}))
            elif not informative(part):
                dropped += 1
            at += n
        if len(kept) >= want or rounds >= max_rounds:
            break
        groups = more(rounds)
    stats = {"dynamic_rounds": rounds, "dynamic_kept_groups": len(kept), "dynamic_dropped_groups": dropped,
             "dynamic_full": len(kept) >= want, "dynamic_dropped_frac": dropped / max(dropped + len(kept), 1)}
    if not kept and first_round is not None:  # nothing informative in any round: the first round as it came
        first_round.stats = stats
        return first_round
    groups = [g for g, _, _ in kept]
    samples, inputs = to_samples(groups)
    names = list(kept[0][2])
    return Filled(groups, samples, inputs, [r for _, part, _ in kept for r in part],
                  {k: [v for _, _, c in kept for v in c[k]] for k in names}, stats)
