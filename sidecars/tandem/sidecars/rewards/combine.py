"""The job's rewards as one weighted sum, and the runner overlapping them with model inference.

Role: `RewardSet(spec.rewards)` maps each spec `Reward` to its function in one place
(`answerMatch` -> `answer.answer_match` in the spec's `match` mode, `format` -> `format.format_match`,
`codeExec` -> `sandbox.code_exec_reward`, `model` -> a `RewardModelScorer`, `environment` -> the reward the
multi-turn environment gave the trajectory, 0 where none); the total reward of a sample is
sum(weight_i x score_i). `overlapped(...)` runs the rule-based rewards in a thread pool WHILE the
calling thread runs the model-based inference work (the driver's reference log-probs callable,
then the reward models), and returns both with measured timings. Callers: the driver (Inference
phase of each iteration), benchmarks.

Component names: the reward's type (`answerMatch`, `format`, ...), suffixed `#i` (its index in the
spec list) when a type appears more than once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from tandem.sidecars.rewards.answer import answer_match
from tandem.sidecars.rewards.code_exec import code_exec_reward
from tandem.sidecars.rewards.format import compile_pattern, format_match
from tandem.spec.rewards import Reward

T = TypeVar("T")


@dataclass(frozen=True)
class RewardInput:
    prompt: str
    completion: str
    answer: Any = None  # the dataset's answer field: reference answer, or tests for codeExec
    env_reward: float | None = None  # the environment's own reward for the trajectory (rollout.environment)


class Scorer(Protocol):
    def score(self, prompts: Sequence[str], completions: Sequence[str]) -> list[float]: ...


RuleFn = Callable[[RewardInput], float]


def rule_function(spec: Reward) -> RuleFn | None:
    """The per-sample function of a rule-based reward; None for `model` (batched, see RewardSet)."""
    if spec.type == "answerMatch":
        match = spec.match
        return lambda x: answer_match(x.completion, x.answer, match)
    if spec.type == "format":
        pattern = spec.pattern or ""
        return lambda x: format_match(x.completion, pattern)
    if spec.type == "codeExec":
        timeout = spec.timeout_seconds
        return lambda x: code_exec_reward(x.completion, x.answer, timeout)
    if spec.type == "environment":
        return lambda x: 0.0 if x.env_reward is None else float(x.env_reward)
    return None


def _default_loader(path: str) -> Scorer:
    from tandem.sidecars.rewards.reward_model import RewardModelScorer

    return RewardModelScorer(path)


@dataclass
class RewardSet:
    """The spec's rewards; reward models are loaded on first use by `model_loader(path)`."""

    specs: Sequence[Reward]
    model_loader: Callable[[str], Scorer] = _default_loader
    _models: dict[str, Scorer] = field(default_factory=dict, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        for i, spec in enumerate(self.specs):  # a bad pattern fails here, naming its field, not on every sample
            if spec.type == "format":
                compile_pattern(spec.pattern or "", f"spec.rewards[{i}].pattern")

    @property
    def names(self) -> list[str]:
        types = [s.type for s in self.specs]
        return [t if types.count(t) == 1 else f"{t}#{i}" for i, t in enumerate(types)]

    def rule_indices(self) -> list[int]:
        return [i for i, s in enumerate(self.specs) if s.type != "model"]

    def model_indices(self) -> list[int]:
        return [i for i, s in enumerate(self.specs) if s.type == "model"]

    def score_rules(
        self, items: Sequence[RewardInput], pool: Executor | None = None
    ) -> dict[str, list[float]]:
        """Every rule-based component for every item (in `pool` when given, one task per sample)."""
        out: dict[str, list[float]] = {}
        for i in self.rule_indices():
            fn = rule_function(self.specs[i])
            if fn is None:
                continue
            if pool is None:
                out[self.names[i]] = [fn(x) for x in items]
            else:
                futures = [pool.submit(fn, x) for x in items]
                out[self.names[i]] = [f.result() for f in futures]
        return out

    def scorer(self, path: str) -> Scorer:
        with self._lock:
            if path not in self._models:
                self._models[path] = self.model_loader(path)
            return self._models[path]

    def score_models(self, items: Sequence[RewardInput]) -> dict[str, list[float]]:
        prompts = [x.prompt for x in items]
        completions = [x.completion for x in items]
        return {self.names[i]: self.scorer(self.specs[i].path or "").score(prompts, completions)
                for i in self.model_indices()}

    def release_models(self) -> None:
        """Forget loaded reward models (reloaded on next use)."""
        with self._lock:
            self._models.clear()

    def combine(self, components: dict[str, list[float]]) -> list[float]:
        """Weighted sum per sample over all components."""
        n = len(next(iter(components.values()))) if components else 0
        total = [0.0] * n
        for name, spec in zip(self.names, self.specs, strict=True):
            for j, v in enumerate(components[name]):
                total[j] += spec.weight * v
        return total

    def score(self, items: Sequence[RewardInput]) -> tuple[list[float], dict[str, list[float]]]:
        """Sequential scoring (no overlap): (totals, components)."""
        components = {**self.score_rules(items), **self.score_models(items)}
        return self.combine(components), components


@dataclass(frozen=True)
class OverlapTimings:
    rule_seconds: float  # first rule task submitted -> last rule task finished
    model_seconds: float  # model work + reward models on the calling thread
    wall_seconds: float
    overlap_seconds: float  # time both were running
    overlap_fraction: float  # overlap / the shorter of the two (1.0: fully hidden)


@dataclass(frozen=True)
class OverlapResult(Generic[T]):
    rewards: list[float]
    components: dict[str, list[float]]
    model_result: T
    timings: OverlapTimings


def overlapped(
    rewards: RewardSet, items: Sequence[RewardInput], model_work: Callable[[], T], *,
    pool: Executor | None = None, workers: int = 4,
) -> OverlapResult[T]:
    """Rule-based rewards in a pool, concurrently with `model_work()` then the reward models."""
    own = pool is None
    executor = pool or ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tandem-reward")
    t0 = time.monotonic()
    rule_end = [t0]
    lock = threading.Lock()

    def timed(fn: RuleFn, x: RewardInput) -> float:
        value = fn(x)
        with lock:
            rule_end[0] = max(rule_end[0], time.monotonic())
        return value

    try:
        pending: dict[str, list[Future[float]]] = {}
        for i in rewards.rule_indices():
            fn = rule_function(rewards.specs[i])
            if fn is not None:
                pending[rewards.names[i]] = [executor.submit(timed, fn, x) for x in items]
        m0 = time.monotonic()
        model_result = model_work()
        components = rewards.score_models(items)
        m1 = time.monotonic()
        for name, futures in pending.items():
            components[name] = [f.result() for f in futures]
        t1 = time.monotonic()
    finally:
        if own:
            executor.shutdown(wait=True)
    r1 = rule_end[0] if pending else t0
    rule_s, model_s = r1 - t0, m1 - m0
    overlap = max(0.0, min(r1, m1) - max(t0, m0))
    shorter = min(rule_s, model_s)
    timings = OverlapTimings(rule_s, model_s, t1 - t0, overlap, overlap / shorter if shorter > 0 else 0.0)
    ordered = {n: components[n] for n in rewards.names}
    return OverlapResult(rewards.combine(ordered), ordered, model_result, timings)
