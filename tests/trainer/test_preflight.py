"""The trainer's checks before its ranks start (`tandem.sidecars.trainer.loop.preflight`), in process and on the
real entry point: every dataset row is counted as the driver sends it (the model's tokenizer and chat
template) against the rollout's context length, and a row without room for one generated token is
refused naming the file, the row, its token count, the limit and the fields; a broken model directory
or dataset makes `python -m tandem.sidecars.trainer` exit 2 with one line, no traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tandem.sidecars.trainer.loop import preflight
from tandem.sidecars.trainer.loop.data.dataset import Prompt, PromptDataset
from tandem.spec.models import JobSpec
from tandem.spec.podenv import PodEnv

CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
ROWS = [{"prompt": "a b c", "answer": 1}, {"prompt": " ".join("b" * 8), "answer": 2},
        {"prompt": " ".join("c" * 20), "answer": 3}]


def model_dir(root: Path) -> Path:
    """A model directory as far as the checks read it: config.json and a byte-level BPE tokenizer with a
    chat template (no weights: nothing here loads them)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    corpus = [" ".join("abcdefgh"[(i * j) % 8] for j in range(9)) for i in range(50)]
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=300, special_tokens=[
        "<unk>", "<eos>", "<|im_start|>", "<|im_end|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>")
    fast.chat_template = CHATML
    d = root / "model"
    fast.save_pretrained(d)
    (d / "config.json").write_text(json.dumps({"model_type": "qwen2", "max_position_embeddings": 64}))
    return d


def sent_lengths(spec: JobSpec) -> list[int]:
    """Tokens of each dataset row as the trainer sends them (its tokenizer, its dataset loader)."""
    tokenizer = preflight.load_tokenizer(spec.model.path)
    return [len(p.model_input) for p in PromptDataset.load(spec.dataset, tokenizer).prompts]


def write_rows(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def spec_doc(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    return {"model": {"path": str(model_dir(tmp_path))}, "gpusPerPod": 0, "rewards": [{"type": "answerMatch"}],
            "dataset": {"path": str(write_rows(tmp_path / "train.jsonl", ROWS))}, **extra}


def test_rows_are_counted_as_sent_and_the_first_too_long_one_is_named(tmp_path: Path) -> None:
    spec = JobSpec.model_validate(spec_doc(tmp_path))
    first, second, third = sent_lengths(spec)
    assert 3 + 10 < first < second < third  # "a b c" is 3 tokens; the chat template's are counted too
    spec.rollout.max_model_len = second  # row 2 exactly at the limit: no room for a generated token
    with pytest.raises(preflight.PreflightError) as err:
        preflight.check(spec)
    assert str(err.value).startswith(
        f"{spec.dataset.path}: row 2 (spec.dataset.path): the prompt is {second} tokens as sent (chat template "
        f"applied), which leaves no room for a generated token in the rollout's context length of {second} tokens "
        "(spec.rollout.maxModelLen); 2 rows in all (also rows 3). Raise spec.rollout.maxModelLen")
    spec.rollout.max_model_len = third + 1
    preflight.check(spec)


def test_the_default_context_length_and_the_eval_rows_sent(tmp_path: Path) -> None:
    doc = spec_doc(tmp_path, rollout={"maxTokens": 4})  # no maxModelLen: min(4 + 1024, 64 positions) = 64
    doc["eval"] = {"dataset": {"path": str(write_rows(tmp_path / "test.jsonl", ROWS[:1] + [
        {"prompt": " ".join("d" * 60), "answer": 4}]))}, "prompts": 1}
    preflight.check(JobSpec.model_validate(doc))  # the eval's long row 2 is never sent: prompts 1
    doc["eval"]["prompts"] = 2
    spec = JobSpec.model_validate(doc)
    assert spec.eval is not None
    long_row = sent_lengths(spec.model_copy(update={"dataset": spec.eval.dataset}))[1]
    with pytest.raises(preflight.PreflightError) as err:
        preflight.check(spec)
    assert str(err.value).startswith(f"{tmp_path}/test.jsonl: row 2 (spec.eval.dataset.path): the prompt is "
                                     f"{long_row} tokens")
    assert "context length of 64 tokens (spec.rollout.maxModelLen unset: spec.rollout.maxTokens 4 + 1024, at " \
           "most the model's max_position_embeddings)" in str(err.value)


def test_the_limit_itself_is_refused_one_below_passes() -> None:
    prompts = [Prompt("x", None, i, token_ids=[7] * n) for i, n in enumerate([9, 10, 3, 11, 12, 13, 14, 15, 16])]
    preflight.check_lengths(prompts[:1], 10, "d.jsonl", "spec.dataset", "f")
    with pytest.raises(preflight.PreflightError, match=r"row 2 .* is 10 tokens .* 7 rows in all \(also rows "
                                                       r"4, 5, 6, 7, 8, \.\.\.\)"):
        preflight.check_lengths(prompts, 10, "d.jsonl", "spec.dataset", "f")


def run_trainer(tmp_path: Path, spec: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    """`python -m tandem.sidecars.trainer` with a pod env as the builders write it (no etcd is reached)."""
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({"apiVersion": "tandem.dev/v1alpha1", "kind": "RLHFJob",
                                   "metadata": {"name": "j"}, "spec": spec}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_")}
    env.update(PodEnv.environ(job="j", role="trainer", pod="j-0", job_file=job, port=1,
                              etcd_endpoints="http://127.0.0.1:1"))
    return subprocess.run([sys.executable, "-m", "tandem.sidecars.trainer"], env=env, capture_output=True,
                          text=True, timeout=300, check=False)


def test_the_entry_point_refuses_a_broken_model_dir_in_one_line(tmp_path: Path) -> None:
    doc = spec_doc(tmp_path)
    (Path(doc["model"]["path"]) / "config.json").unlink()
    done = run_trainer(tmp_path, doc)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.endswith(f"ERROR spec.model.path: {doc['model']['path']}/config.json is missing (a HuggingFace "
                         "model directory has one)"), done.stderr


def test_the_entry_point_refuses_a_too_long_row_in_one_line(tmp_path: Path) -> None:
    doc = spec_doc(tmp_path)
    _, second, third = sent_lengths(JobSpec.model_validate(doc))
    done = run_trainer(tmp_path, {**doc, "rollout": {"maxModelLen": second + 1}})
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert f"ERROR {tmp_path}/train.jsonl: row 3 (spec.dataset.path): the prompt is {third} tokens" in last, \
        done.stderr
    assert f"context length of {second + 1} tokens (spec.rollout.maxModelLen)" in last


def test_a_teacher_or_reference_of_another_shape_is_refused_naming_its_field(tmp_path: Path) -> None:
    """Both are scored by swapping their weights into the trainer's engine: a teacher whose config gives
    another shape stops the job before the engine is built, naming the field and the key."""
    doc = spec_doc(tmp_path)
    teacher = model_dir(tmp_path / "teacher")
    doc["algorithm"] = {"distillation": {"teacher": str(teacher)}}
    preflight.check(JobSpec.model_validate(doc))  # the same config: accepted
    (teacher / "config.json").write_text(json.dumps({"model_type": "llama", "max_position_embeddings": 64}))
    with pytest.raises(preflight.PreflightError) as err:
        preflight.check(JobSpec.model_validate(doc))
    assert str(err.value) == (
        f"spec.algorithm.distillation.teacher: {teacher} is scored in the trainer's engine in place of the model's "
        "weights, so it must have the shape of spec.model.path: config.json's model_type is 'llama' where the "
        "model has 'qwen2'")
    doc = spec_doc(tmp_path, reference={"path": str(teacher)})
    with pytest.raises(preflight.PreflightError, match="^spec.reference.path: "):
        preflight.check(JobSpec.model_validate(doc))


def test_a_picture_counts_as_its_image_tokens(tmp_path: Path) -> None:
    """A VLM's prompt holds one placeholder per picture, which vLLM expands to image_seq_length tokens: the
    limit is checked on the expanded count (the tiny LLaVA of tests/rollout_engine/tiny_model.py, 16 per picture)."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "rollout_engine"))
    import tiny_model

    from tandem.sidecars.vlm_demo import build, shapes

    vlm = tiny_model.save_vlm(tmp_path / "vlm")
    data = shapes.write_split(tmp_path / "data", "train", 2, seed=1)
    spec = JobSpec.model_validate({"model": {"path": str(vlm)}, "gpusPerPod": 0, "rewards": [{"type": "answerMatch"}],
                                   "dataset": {"path": str(data), "promptField": "messages"}})
    sent = sent_lengths(spec)  # the placeholder counted once
    expanded = [n + build.IMAGE_TOKENS - 1 for n in sent]
    spec.rollout.max_model_len = max(sent) + 2  # room for the placeholders, not for the pictures' tokens
    with pytest.raises(preflight.PreflightError) as err:
        preflight.check(spec)
    assert str(err.value).startswith(f"{data}: row 1 (spec.dataset.path)")  # every row is over: row 1 named
    assert f"the prompt is {expanded[0]} tokens as sent (chat template applied, each picture its " \
           f"{build.IMAGE_TOKENS} image tokens)" in str(err.value)
    spec.rollout.max_model_len = max(expanded) + 1
    preflight.check(spec)


def test_a_qwen_vl_picture_counts_as_its_own_grid_of_tokens(tmp_path: Path) -> None:
    """Qwen2.5-VL: a picture's placeholder becomes as many image tokens as its grid of patches holds (its size as
    the image processor resizes it, 2x2 patches a token): a 100x60 picture is 8 tokens, a 64x64 one 4 (the tiny
    Qwen2.5-VL of tests/rollout_engine/tiny_model.py); the limit is checked on each row's own count."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "rollout_engine"))
    import tiny_model
    from PIL import Image

    vlm = tiny_model.save_qwen_vl(tmp_path / "vlm")
    rows = []
    for i, size in enumerate(((100, 60), (64, 64))):
        Image.new("RGB", size, (200, 30, 30)).save(tmp_path / f"{i}.png")
        rows.append({"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": f"{i}.png"}}, {"type": "text", "text": "alpha"}]}], "answer": 1})
    data = write_rows(tmp_path / "rows.jsonl", rows)
    spec = JobSpec.model_validate({"model": {"path": str(vlm)}, "gpusPerPod": 0, "rewards": [{"type": "answerMatch"}],
                                   "dataset": {"path": str(data), "promptField": "messages"}})
    sent = sent_lengths(spec)  # each placeholder counted once
    expanded = [sent[0] + 8 - 1, sent[1] + 4 - 1]
    spec.rollout.max_model_len = expanded[1] + 1  # room for the second row's 4 tokens, not for the first's 8
    with pytest.raises(preflight.PreflightError) as err:
        preflight.check(spec)
    assert str(err.value).startswith(f"{data}: row 1 (spec.dataset.path): the prompt is {expanded[0]} tokens as "
                                     "sent (chat template applied, each picture its image tokens)"), str(err.value)
    assert "rows in all" not in str(err.value)  # the second row fits
    spec.rollout.max_model_len = max(expanded) + 1
    preflight.check(spec)
