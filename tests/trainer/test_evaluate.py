"""Held-out evaluation: the pass@k estimator, scoring scripted completions, schedule, spec rules.

The generator is a scripted stand-in for the rollouts (texts chosen per prompt); the live vLLM
version of the same check is tests/rollout_engine/test_eval_live.py.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from pydantic import ValidationError

from tandem.sidecars.rollout_engine.sampling import Completion, SamplingOptions
from tandem.sidecars.trainer.loop.data.dataset import Prompt
from tandem.sidecars.trainer.loop.held_out import Evaluator, pass_at_k
from tandem.spec.data import Dataset, Eval
from tandem.spec.models import JobSpec
from tandem.spec.rewards import Reward

# ---- pass@k --------------------------------------------------------------------------------------


def brute_force(n: int, c: int, k: int) -> float:
    """Share of the k-subsets of n samples (the first c correct) holding at least one correct."""
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(i < c for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", range(1, 11))
def test_pass_at_k_equals_enumerating_every_draw(n: int) -> None:
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(brute_force(n, c, k), abs=1e-12), (n, c, k)


def test_pass_at_k_equals_the_binomial_form_up_to_64_samples() -> None:
    for n in (12, 20, 33, 64):
        for c in range(0, n + 1, 3):
            for k in (1, 2, 5, n // 2, n):
                want = 1.0 - math.comb(n - c, k) / math.comb(n, k)
                assert pass_at_k(n, c, k) == pytest.approx(want, abs=1e-9), (n, c, k)
    assert pass_at_k(8, 3, 1) == pytest.approx(3 / 8)  # pass@1 is the share of correct samples
    with pytest.raises(ValueError, match="exceeds"):
        pass_at_k(4, 1, 5)


# ---- Evaluator with a scripted generator ---------------------------------------------------------


@dataclass
class Scripted:
    """A Generator answering prompt i with `texts[i]` (n of them), recording what it was asked."""

    texts: list[list[str]]
    calls: list[tuple[list[Any], SamplingOptions, int]] = field(default_factory=list)
    served: int | None = None  # the weight version the rollouts report (None: not known)

    def generate(self, prompts: Sequence[str] | Sequence[list[int]], options: SamplingOptions,
                 n: int) -> tuple[list[list[Completion]], set[int | None]]:
        self.calls.append((list(prompts), options, n))
        assert len(prompts) == len(self.texts)
        groups = []
        for i, (p, texts) in enumerate(zip(prompts, self.texts, strict=True)):
            assert len(texts) == n
            ids = [1, 2] if isinstance(p, str) else list(cast(list[int], p))
            groups.append([Completion(prompt_index=i, sample_index=j, prompt_token_ids=ids, token_ids=[5, 6],
                                      logprobs=[-0.1, -0.2], text=t, finish_reason="stop")
                           for j, t in enumerate(texts)])
        return groups, {self.served}


def prompts(answers: Sequence[Any], *, ids: bool = False) -> list[Prompt]:
    return [Prompt(f"question {i}?", a, i, token_ids=[10 + i, 20 + i] if ids else None)
            for i, a in enumerate(answers)]


def spec(**kw: Any) -> Eval:
    return Eval(dataset=Dataset(path="/data/eval.jsonl"), **kw)


ANSWER = Reward(type="answerMatch")
FORMAT = Reward(type="format", pattern=r"^<answer>.*</answer>$", weight=0.5)

# answers "4", "Paris", "7"; per prompt: which samples are correct by answerMatch
TEXTS = [
    ["<answer>4</answer>", "<answer>5</answer>", "4", "no idea"],  # 2 of 4 (the bare "4" fails the format)
    ["London", "<answer>Rome</answer>", "berlin", ""],  # 0 of 4
    ["7", "Answer: 7", "<answer>7</answer>", "7."],  # 4 of 4
]
CORRECT = [[True, False, True, False], [False] * 4, [True] * 4]


def test_pass_at_1_and_k_from_scripted_completions_ignore_the_format_reward() -> None:
    gen = Scripted(TEXTS)
    ev = Evaluator(spec(samples=4, every=5, temperature=1.0), prompts(["4", "Paris", "7"]), [FORMAT, ANSWER],
                   max_tokens=32, iterations=20)
    result = ev.run(gen, iteration=5, version=6)
    n = len(CORRECT)
    share = sum(sum(c) / len(c) for c in CORRECT) / n  # mean share of correct samples per prompt
    any_correct = sum(any(c) for c in CORRECT) / n  # k = n samples: prompts with at least one
    assert result.pass_at_1 == pytest.approx(share) and share == pytest.approx(0.5)
    assert result.pass_at_k == pytest.approx(any_correct) and any_correct == pytest.approx(2 / 3)
    assert result.reward_mean == pytest.approx(sum(map(sum, CORRECT)) / 12)  # answerMatch only
    assert (result.iteration, result.version, result.prompts, result.samples) == (5, 6, 3, 4)
    row = result.row()
    assert row["k"] == 4 and row["pass_at_1"] == result.pass_at_1 and row["pass_at_k"] == result.pass_at_k
    assert result.seconds >= 0.0
    # every answer kept, judged as pass@1 counted it (eval-samples.jsonl)
    assert [(s["prompt"], s["sample"], s["text"], s["passed"]) for s in ev.samples] == [
        (j, i, TEXTS[j][i], CORRECT[j][i]) for j in range(3) for i in range(4)]
    assert {(s["iteration"], s["version"], s["tokens"], s["finish_reason"]) for s in ev.samples} == {(5, 6, 2, "stop")}


def test_the_generator_gets_the_specs_sampling_and_the_first_prompts() -> None:
    gen = Scripted([["4", "5"], ["x", "Paris"]])
    ev = Evaluator(spec(samples=2, prompts=2, temperature=0.7, seed=11), prompts(["4", "Paris", "9"], ids=True),
                   [ANSWER], max_tokens=48, iterations=10)
    result = ev.run(gen, iteration=0, version=1)
    [(inputs, opts, n)] = gen.calls
    assert inputs == [[10, 20], [11, 21]]  # the chat-templated ids, only the first `prompts`
    assert n == 2 and opts.temperature == 0.7 and opts.seed == 11 and opts.max_tokens == 48
    assert result.prompts == 2 and result.pass_at_1 == pytest.approx(0.5)
    assert result.pass_at_k == pytest.approx(1.0)
    # without token ids the text goes; eval.maxTokens overrides the rollout's
    gen2 = Scripted([["4"]])
    Evaluator(spec(max_tokens=7), prompts(["4"]), [ANSWER], max_tokens=48, iterations=1).run(gen2, 0, 0)
    assert gen2.calls[0][0] == ["question 0?"] and gen2.calls[0][1].max_tokens == 7


@dataclass
class Trajectories(Scripted):
    """Multi-turn rollouts: prompt i's samples end with `texts[i]`, the environment rewarding `rewards[i]`."""

    rewards: list[list[float | None]] = field(default_factory=list)
    asked: list[tuple[list[Any], list[Any] | None, int]] = field(default_factory=list)

    def trajectories(self, rows: Sequence[list[dict[str, Any]]], options: SamplingOptions, n: int,
                     data: Sequence[dict[str, Any]] | None = None
                     ) -> tuple[list[list[dict[str, Any]]], set[int | None]]:
        self.asked.append((list(rows), None if data is None else list(data), n))
        return [[{"text": t, "reward": r, "tool_calls": 2 if r else 0} for t, r in zip(texts, rewards, strict=True)]
                for texts, rewards in zip(self.texts, self.rewards, strict=True)], {self.served}


def test_multi_turn_jobs_are_evaluated_on_trajectories_judged_by_their_rewards() -> None:
    """A multi-turn job's eval runs its environment (trajectories, not single replies): the last reply is
    judged by answerMatch, and an `environment` reward counts as a verifiable one."""
    gen = Trajectories([["4", "4"], ["7", "8"]], rewards=[[1.0, 0.0], [1.0, None]])
    both = [ANSWER, Reward(type="environment", weight=3.0)]
    ev = Evaluator(spec(samples=2, temperature=1.0), prompts(["4", "7"]), both, max_tokens=8, iterations=2,
                   multi_turn=True)
    result = ev.run(gen, 2, 2)
    [(rows, data, n)] = gen.asked
    assert not gen.calls and n == 2 and rows == [[{"role": "user", "content": "question 0?"}],
                                                  [{"role": "user", "content": "question 1?"}]]
    assert data == [{"question": "question 0?", "answer": "4", "index": 0},
                    {"question": "question 1?", "answer": "7", "index": 1}]
    assert result.pass_at_1 == pytest.approx(0.5)  # "4" rewarded 0 by the environment fails; "7" passes both
    assert result.row()["tool_calls_mean"] == pytest.approx(1.0)  # 2 calls in 2 of the 4 samples
    assert "tool_calls_mean" not in Evaluator(spec(samples=1), prompts(["4"]), [ANSWER], max_tokens=8,
                                              iterations=1).run(Scripted([["4"]]), 0, 0).row()


def test_one_sample_gives_pass_at_k_equal_to_pass_at_1() -> None:
    gen = Scripted([["4"], ["Lyon"], ["7"]])
    result = Evaluator(spec(samples=1), prompts(["4", "Paris", "7"]), [ANSWER], max_tokens=8,
                       iterations=3).run(gen, 3, 3)
    assert result.pass_at_1 == result.pass_at_k == pytest.approx(2 / 3)


def test_greedy_draws_one_sample_per_prompt_and_counts_it_k_times() -> None:
    """vLLM refuses n > 1 at temperature 0, and greedy samples would all be the same anyway."""
    gen = Scripted([["4"], ["Lyon"], ["<answer>7</answer>"]])
    ev = Evaluator(spec(samples=4, temperature=0.0), prompts(["4", "Paris", "7"]), [ANSWER, FORMAT],
                   max_tokens=8, iterations=3)
    result = ev.run(gen, 3, 3)
    assert [n for _, _, n in gen.calls] == [1] and gen.calls[0][1].temperature == 0.0
    assert result.samples == 4 and result.row()["k"] == 4
    assert result.pass_at_1 == result.pass_at_k == pytest.approx(2 / 3)
    assert result.reward_mean == pytest.approx(2 / 3)


def test_a_generator_returning_the_wrong_number_of_samples_is_an_error() -> None:
    class Short(Scripted):
        def generate(self, prompts: Sequence[str] | Sequence[list[int]], options: SamplingOptions,
                     n: int) -> tuple[list[list[Completion]], set[int | None]]:
            return super().generate(prompts, options, n - 1)

    ev = Evaluator(spec(samples=3, temperature=1.0), prompts(["4"]), [ANSWER], max_tokens=8, iterations=1)
    with pytest.raises(RuntimeError, match="3 completions per prompt"):
        ev.run(Short([["4", "4"]]), 0, 0)


def test_answers_of_another_version_than_the_one_evaluated_are_an_error() -> None:
    ev = Evaluator(spec(), prompts(["4"]), [ANSWER], max_tokens=8, iterations=1)
    assert ev.run(Scripted([["4"]], served=7), 2, 7).pass_at_1 == 1.0
    with pytest.raises(RuntimeError, match="eval of version 7: the rollouts served \\['6'\\]"):
        ev.run(Scripted([["4"]], served=6), 2, 7)


def test_code_exec_needs_every_test_to_pass() -> None:
    tests = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"]
    texts = [[
        "```python\ndef add(a, b):\n    return a + b\n```",  # passes both
        "```python\ndef add(a, b):\n    return 3\n```",  # passes one of two: not correct
        "```python\ndef add(a, b):\n    return a - b\n```",  # passes none
    ]]
    code = Reward(type="codeExec", timeout_seconds=60.0)  # the verdicts, not the speed: no timeout under load
    result = Evaluator(spec(samples=3, temperature=0.8), prompts([tests]), [code, FORMAT], max_tokens=64,
                       iterations=1).run(Scripted(texts), 1, 1)
    assert result.pass_at_1 == pytest.approx(1 / 3)
    assert result.pass_at_k == pytest.approx(1.0)
    assert result.reward_mean == pytest.approx((1.0 + 0.5 + 0.0) / 3)  # the pass fractions


def test_every_verifiable_reward_must_give_full_marks() -> None:
    # answerMatch and codeExec both judge: a right answer whose code fails is not correct
    tests = ["assert f() == 1"]
    code = Reward(type="codeExec", timeout_seconds=60.0)  # the verdicts, not the speed: no timeout under load
    both = [Reward(type="answerMatch", match="flexible"), code]
    texts = [["```python\ndef f():\n    return 1\n```", "```python\ndef f():\n    return 2\n```"]]
    ev = Evaluator(spec(samples=2, temperature=1.0), prompts([tests]), both, max_tokens=64, iterations=1)
    result = ev.run(Scripted(texts), 0, 0)
    assert result.pass_at_1 == 0.0  # the answer field is test code: no completion "answers" it
    ok = Evaluator(spec(samples=2, temperature=1.0), prompts([tests]), [code], max_tokens=64, iterations=1)
    assert ok.run(Scripted(texts), 0, 0).pass_at_1 == pytest.approx(0.5)


@pytest.mark.parametrize(("every", "iterations", "due"), [
    (3, 10, {0, 3, 6, 9, 10}),
    (4, 10, {0, 4, 8, 10}),
    (5, 10, {0, 5, 10}),
    (1, 3, {0, 1, 2, 3}),
    (20, 7, {0, 7}),
])
def test_due_at_start_every_n_and_at_the_end(every: int, iterations: int, due: set[int]) -> None:
    ev = Evaluator(spec(every=every), prompts(["1"]), [ANSWER], max_tokens=8, iterations=iterations)
    assert {i for i in range(iterations + 1) if ev.due(i)} == due


def test_a_job_without_a_verifiable_reward_is_refused() -> None:
    model = Reward(type="model", path="/models/rm")
    with pytest.raises(ValueError, match="answerMatch, codeExec or environment"):
        Evaluator(spec(), prompts(["1"]), [FORMAT, model], max_tokens=8, iterations=1)


def test_the_spec_refuses_eval_without_a_verifiable_reward() -> None:
    base: dict[str, Any] = {"model": {"path": "m"}, "dataset": {"path": "d"},
                            "eval": {"dataset": {"path": "/data/eval.jsonl"}, "every": 2}}
    with pytest.raises(ValidationError) as err:
        JobSpec.model_validate({**base, "rewards": [{"type": "format", "pattern": "x"}]})
    assert "eval" in str(err.value) and "answerMatch, codeExec or environment" in str(err.value)
    for kind in ("answerMatch", "codeExec"):
        job = JobSpec.model_validate({**base, "rewards": [{"type": "format", "pattern": "x"}, {"type": kind}]})
        assert job.eval is not None and job.eval.every == 2 and job.eval.samples == 1
    assert JobSpec.model_validate({**base, "eval": None, "rewards": [{"type": "format", "pattern": "x"}]}).eval is None

