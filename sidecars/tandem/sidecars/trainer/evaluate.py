"""Held-out evaluation on the rollouts' live vLLM: pass@1 and pass@k of the current weight version.

Role: `spec.eval` names a dataset (the same fields as `spec.dataset`), how often (`every` N
iterations; iteration 0, before any training, and the end of the run are always evaluated), how
many prompts (the first N of the file, the same every time), how many samples per prompt and the
sampling temperature. A sample is correct when every verifiable reward of the job (`answerMatch`,
`codeExec`) gives it full marks; pass@1 is the mean share of correct samples per prompt and pass@k
(k = samples) the unbiased estimator of Chen et al. (2021), which with n = k samples is the share
of prompts with at least one correct sample. Greedy evaluation (temperature 0) generates one
sample per prompt and counts it `samples` times: greedy samples are all the same, and vLLM refuses
n > 1 with greedy sampling. Generation runs on whatever version the rollouts serve (the driver
calls it right after a sync), so no weights move for it.
Caller: `tandem.sidecars.trainer.driver` (driver rank only).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from tandem.checkpoint_engine.models import Completion, SamplingOptions
from tandem.sidecars.rewards.combine import RewardInput, RewardSet
from tandem.sidecars.trainer.dataset import Prompt
from tandem.spec.models import Eval as EvalSpec
from tandem.spec.models import Reward

VERIFIABLE = ("answerMatch", "codeExec")


class Generator(Protocol):
    def generate(self, prompts: Sequence[str | list[int]], options: SamplingOptions,
                 n: int) -> tuple[list[list[Completion]], set[int | None]]: ...


def pass_at_k(n: int, correct: int, k: int) -> float:
    """Probability that at least one of k samples drawn from n (of which `correct` pass) passes."""
    if k > n:
        raise ValueError(f"k={k} exceeds the {n} samples")
    if n - correct < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - correct + 1, n + 1))


@dataclass(frozen=True)
class EvalResult:
    iteration: int
    version: int
    prompts: int
    samples: int
    pass_at_1: float
    pass_at_k: float
    reward_mean: float
    seconds: float

    def row(self) -> dict[str, Any]:
        """The `eval` entry of a metrics row (and of the progress record)."""
        return {"iteration": self.iteration, "version": self.version, "prompts": self.prompts,
                "samples": self.samples, "pass_at_1": self.pass_at_1, "pass_at_k": self.pass_at_k,
                "k": self.samples, "reward_mean": self.reward_mean, "seconds": self.seconds}


class Evaluator:
    def __init__(self, spec: EvalSpec, prompts: Sequence[Prompt], rewards: Sequence[Reward], *,
                 max_tokens: int, iterations: int) -> None:
        verifiable = [r for r in rewards if r.type in VERIFIABLE]
        if not verifiable:
            raise ValueError("eval: the job has no answerMatch or codeExec reward to judge answers with")
        self.spec, self.iterations = spec, iterations
        self.prompts = list(prompts)[: spec.prompts]
        self.rewards = RewardSet([r.model_copy(update={"weight": 1.0}) for r in verifiable])
        self.max_tokens = spec.max_tokens or max_tokens

    def due(self, iteration: int) -> bool:
        """Evaluate before iteration `iteration` (iteration == iterations: after the last one)."""
        return iteration % self.spec.every == 0 or iteration == self.iterations

    def run(self, generator: Generator, iteration: int, version: int) -> EvalResult:
        t = time.perf_counter()
        opts = SamplingOptions(temperature=self.spec.temperature, top_p=1.0, max_tokens=self.max_tokens,
                               seed=self.spec.seed)
        inputs: list[Any] = [p.model_input for p in self.prompts]
        k = self.spec.samples
        drawn = 1 if self.spec.temperature == 0 else k  # greedy: one sample stands for all k
        groups, _ = generator.generate(inputs, opts, n=drawn)
        if any(len(group) != drawn for group in groups):
            raise RuntimeError(f"eval: asked for {drawn} completions per prompt, got {[len(g) for g in groups]}")
        items = [RewardInput(p.question, c.text, p.answer) for p, group in zip(self.prompts, groups, strict=True)
                 for c in group]
        components = self.rewards.score_rules(items)
        passed = [all(components[name][i] >= 1.0 for name in components) for i in range(len(items))]
        per_prompt = [sum(passed[j * drawn:(j + 1) * drawn]) * (k // drawn) for j in range(len(self.prompts))]
        totals = self.rewards.combine(components)
        n = len(self.prompts)
        return EvalResult(
            iteration=iteration, version=version, prompts=n, samples=k,
            pass_at_1=sum(pass_at_k(k, c, 1) for c in per_prompt) / n,
            pass_at_k=sum(pass_at_k(k, c, k) for c in per_prompt) / n,
            reward_mean=sum(totals) / max(len(totals), 1) / len(components),
            seconds=time.perf_counter() - t)
