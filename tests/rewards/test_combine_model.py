"""Weighted sum of the spec's rewards, the reward-model scorer, and the overlapped runner."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch

from tandem.sidecars.rewards import RewardInput, RewardSet, overlapped
from tandem.sidecars.rewards.reward_model import RewardModelScorer
from tandem.sidecars.toy.task import FORMAT_PATTERN, corpus
from tandem.sidecars.toy.tokenizer import save_hf_tokenizer, train_tokenizer
from tandem.spec.rewards import Reward


def _rewards(*specs: dict[str, Any]) -> list[Reward]:
    return [Reward.model_validate(s) for s in specs]


ITEMS = [
    RewardInput("What is 2+2? Answer:", " <answer>4</answer>", "4"),
    RewardInput("What is 2+3? Answer:", " <answer>6</answer>", "5"),
    RewardInput("What is 2+5? Answer:", " 7", "7"),
]


def test_weighted_sum_and_names() -> None:
    rs = RewardSet(_rewards({"type": "answerMatch", "weight": 1.0},
                            {"type": "format", "pattern": FORMAT_PATTERN, "weight": 0.5},
                            {"type": "format", "pattern": r".*7.*", "weight": -2.0}))
    assert rs.names == ["answerMatch", "format#1", "format#2"]
    totals, comps = rs.score(ITEMS)
    assert comps == {"answerMatch": [1.0, 0.0, 1.0], "format#1": [1.0, 1.0, 0.0], "format#2": [0.0, 0.0, 1.0]}
    assert totals == pytest.approx([1.5, 0.5, -1.0])


def test_code_exec_through_reward_set() -> None:
    rs = RewardSet(_rewards({"type": "codeExec", "timeoutSeconds": 3}))
    good = "```python\ndef inc(x):\n    return x + 1\n```"
    items = [RewardInput("write inc", good, ["assert inc(1) == 2"]),
             RewardInput("write inc", "def inc(x): return x", "assert inc(1) == 2\nassert inc(0) == 1")]
    with ThreadPoolExecutor(2) as pool:
        assert rs.score_rules(items, pool) == {"codeExec": [1.0, 0.0]}


@pytest.fixture(scope="module")
def reward_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    out = tmp_path_factory.mktemp("rm")
    tok = save_hf_tokenizer(train_tokenizer(corpus(0, n=300)), out, 64)
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, num_labels=1,
                      pad_token_id=tok.pad_token_id, max_position_embeddings=64)
    Qwen2ForSequenceClassification(cfg).save_pretrained(str(out))
    return out


def test_reward_model_scores_batched_equal_single(reward_model_dir: Path) -> None:
    prompts = [x.prompt for x in ITEMS]
    completions = [x.completion for x in ITEMS]
    batched = RewardModelScorer(reward_model_dir, batch_size=3).score(prompts, completions)
    single = RewardModelScorer(reward_model_dir, batch_size=1).score(prompts, completions)
    assert batched == pytest.approx(single, abs=1e-5)
    assert len(set(round(s, 6) for s in batched)) == 3  # different texts, different scores
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(reward_model_dir))
    model = AutoModelForSequenceClassification.from_pretrained(str(reward_model_dir)).eval()
    with torch.no_grad():
        direct = model(**tok(prompts[0] + completions[0], return_tensors="pt")).logits[0, 0].item()
    assert batched[0] == pytest.approx(direct, abs=1e-5)


class RecordingPool(ThreadPoolExecutor):
    """A thread pool that counts finished tasks (to observe concurrency without timing)."""

    def __init__(self, workers: int) -> None:
        super().__init__(workers)
        self.finished = threading.Semaphore(0)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        fut = super().submit(fn, *args, **kwargs)
        fut.add_done_callback(lambda _: self.finished.release())
        return fut


def test_overlapped_runs_rules_during_model_work(reward_model_dir: Path) -> None:
    rs = RewardSet(_rewards({"type": "answerMatch"}, {"type": "codeExec", "timeoutSeconds": 3, "weight": 0.5},
                            {"type": "model", "path": str(reward_model_dir), "weight": 0.1}))
    items = [RewardInput("p", "```python\nx = 1\n```", ["assert x == 1"]) for _ in range(4)]
    with RecordingPool(4) as pool:

        def model_work() -> str:
            # returns only once rule-based rewards have finished while it runs: proof of overlap
            if not pool.finished.acquire(timeout=60):
                raise AssertionError("no rule-based reward ran during the model work")
            time.sleep(0.2)
            return "ref-logprobs"

        res = overlapped(rs, items, model_work, pool=pool)
    assert res.model_result == "ref-logprobs"
    assert res.components["codeExec"] == [1.0] * 4 and res.components["answerMatch"] == [0.0] * 4
    rm = res.components["model"]
    assert res.rewards == pytest.approx([0.5 + 0.1 * s for s in rm])
    t = res.timings
    assert t.overlap_seconds > 0 and 0 < t.overlap_fraction <= 1.0
    assert t.wall_seconds < t.rule_seconds + t.model_seconds
