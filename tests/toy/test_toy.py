"""The demo's toy task and model: tokenizer, dataset, build cache, CLI, and the warm-up's effect."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tandem.sidecars.rewards.answer import answer_match
from tandem.sidecars.rewards.format import format_match
from tandem.sidecars.toy import FORMAT_PATTERN, ToyPaths, build_toy, make_problems, reward_specs
from tandem.sidecars.toy.build import MANIFEST
from tandem.sidecars.toy.model import accuracy, generate, random_model
from tandem.sidecars.toy.task import read_jsonl, target_completion
from tandem.sidecars.toy.tokenizer import SPLIT_REGEX
from tandem.spec.rewards import Reward

ROOTS = ("operator", "sidecars", "spec", "checkpoint_engine")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> ToyPaths:
    return build_toy(tmp_path_factory.mktemp("toy") / "out", seed=0)  # the demo's defaults


@pytest.fixture(scope="module")
def tokenizer(built: ToyPaths) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(built.model_dir))


@pytest.mark.parametrize("text", ["What is 17+25? Answer: <answer>42</answer>", "  spaces\tand\nlines ",
                                  "unicode: héllo ✓ 日本", "1234567890", "<answer>-3</answer>"])
def test_tokenizer_round_trip(tokenizer: Any, text: str) -> None:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text


def test_tokenizer_shape(tokenizer: Any, built: ToyPaths) -> None:
    assert len(tokenizer) == 384
    assert {tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id} == {0, 1, 2}
    for d in "0123456789":
        assert len(tokenizer(d, add_special_tokens=False)["input_ids"]) == 1
    assert len(tokenizer("9876", add_special_tokens=False)["input_ids"]) == 4  # one token per digit
    assert len(tokenizer("<answer>", add_special_tokens=False)["input_ids"]) == 1
    assert tokenizer("What")["input_ids"][0] == tokenizer.bos_token_id
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (built.model_dir / name).is_file()


def test_qwen2_class_and_plain_backend_tokenize_alike(built: ToyPaths, tokenizer: Any) -> None:
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    assert type(tokenizer).__name__ == "Qwen2Tokenizer"  # what AutoTokenizer and vLLM pick here
    assert SPLIT_REGEX == PRETOKENIZE_REGEX
    plain = TokenizersBackend.from_pretrained(str(built.model_dir))
    assert len(plain) == len(tokenizer) == 384
    for text in ["What is 17+25? Answer: <answer>42</answer>", "(Hello) world!! 123\n\nnext", "it's  x"]:
        assert plain(text)["input_ids"] == tokenizer(text)["input_ids"]


def test_dataset_answers_are_correct(built: ToyPaths) -> None:
    rows = read_jsonl(built.train_path)
    assert len(rows) == 2048 and set(rows[0]) == {"prompt", "answer"}
    for r in rows:
        m = re.fullmatch(r"What is (\d+)([+-])(\d+)\? Answer:", r["prompt"])
        assert m is not None
        a, op, b = int(m[1]), m[2], int(m[3])
        assert int(r["answer"]) == (a + b if op == "+" else a - b)
        assert answer_match(target_completion(r["answer"]), r["answer"]) == 1.0
        assert format_match(target_completion(r["answer"]), FORMAT_PATTERN) == 1.0
    assert make_problems(5, 10) == make_problems(5, 10) != make_problems(6, 10)
    subtract = make_problems(1, 200, ops=("-",))
    assert all(int(r["answer"]) >= 0 for r in subtract)
    assert [Reward.model_validate(s).type for s in reward_specs()] == ["answerMatch", "format"]


def test_model_loads_and_warm_up_raises_accuracy(built: ToyPaths, tokenizer: Any) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(built.model_dir)).eval()
    cfg = model.config
    assert cfg.model_type == "qwen2" and not cfg.tie_word_embeddings
    assert cfg.num_key_value_heads < cfg.num_attention_heads and cfg.vocab_size == len(tokenizer)
    assert (built.model_dir / "model.safetensors").is_file()
    rows = read_jsonl(built.test_path)[:128]
    before = accuracy(random_model(tokenizer, seed=0).eval(), tokenizer, rows)
    after = accuracy(model, tokenizer, rows)
    assert after >= before + 0.05, (before, after)
    assert built.metrics["accuracy_after"] == pytest.approx(after)
    # stopped at the target or the cap: answers right sometimes, not saturated
    assert built.metrics["warmup_steps_run"] <= 300 and after < 0.9
    completions = generate(model, tokenizer, [r["prompt"] for r in rows[:32]])
    assert sum(format_match(c, FORMAT_PATTERN) for c in completions) >= 28  # the format is learnt


def test_build_is_cached_and_rebuilt_on_change(tmp_path: Path) -> None:
    first = build_toy(tmp_path / "t", seed=3, warmup_steps=0, train_size=64, test_size=16, eval_size=8)
    stamp = (first.model_dir / "model.safetensors").stat().st_mtime_ns
    again = build_toy(tmp_path / "t", seed=3, warmup_steps=0, train_size=64, test_size=16, eval_size=8)
    assert (again.model_dir / "model.safetensors").stat().st_mtime_ns == stamp
    assert again.metrics == first.metrics
    (first.model_dir / "model.safetensors").unlink()  # incomplete build: rebuilt
    third = build_toy(tmp_path / "t", seed=3, warmup_steps=0, train_size=64, test_size=16, eval_size=8)
    assert (third.model_dir / "model.safetensors").is_file()
    fourth = build_toy(tmp_path / "t", seed=4, warmup_steps=0, train_size=64, test_size=16, eval_size=8)
    assert json.loads(fourth.manifest_path.read_text())["params"]["seed"] == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t"]  # no staging dirs left


def test_cli(tmp_path: Path) -> None:
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(repo / r) for r in ROOTS)}
    cmd = [sys.executable, "-m", "tandem.sidecars.toy", str(tmp_path / "c"), "--warmup-steps", "0"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=600, env=env)
    report = json.loads(out.stdout)
    assert Path(report["model"]).is_dir() and Path(report["train"]).is_file()
    assert (tmp_path / "c" / MANIFEST).is_file()
