"""End to end with a vision-language model: `tandem run` trains a LLaVA on pictures, and its export loads in
transformers and in vLLM alike.

The VLM demo's builder on tests/rollout_engine/tiny_model.py's Qwen2 (a SigLIP tower and LLaVA's projector added),
its picture split (shapes.py), one row whose picture is missing. `trainer.engine` is left at auto, which picks
hf for model_type llava. Asserted: the bad row is refused and counted (metrics.jsonl, the trainer's log naming
its row) while the job goes on; the live vLLM samples with the trainer's exact log-probs (mismatch KL per token
as small as a text job's: the pictures reach both, and the image token, never sampled, is scored so too); the
exported directory loads in transformers with nothing missing, and vLLM, started on it, greedy-decodes a picture
prompt to exactly transformers' tokens.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

# remove_shm_dirs (autouse: each test's /dev/shm dirs go) is a fixture
from test_tandem_run import USED, processes_of, remove_shm_dirs, run_cmd, run_ok  # noqa: F401

pytestmark = [pytest.mark.e2e, pytest.mark.vllm, pytest.mark.etcd]

ITERATIONS = 2


def vlm_job(root: Path, name: str) -> dict[str, Any]:
    sys.path.insert(0, str(Path(__file__).parents[1] / "rollout_engine"))
    import tiny_model

    from tandem.sidecars.vlm_demo import shapes

    USED.append(name)
    model = tiny_model.save_vlm(root)
    train = shapes.write_split(root / "data", "train", 12, seed=1)
    missing = {"messages": [{"role": "user", "content": [{"type": "image", "path": "images/gone.png"},
                                                         {"type": "text", "text": "What colour?"}]}], "answer": "red"}
    with train.open("a") as f:
        f.write(json.dumps(missing) + "\n")
    test = shapes.write_split(root / "data", "test", 8, seed=2)
    return picture_job(name, model, train, test, root)


def picture_job(name: str, model: Path, train: Path, test: Path, root: Path) -> dict[str, Any]:
    """The e2e job on pictures (the shapes task): 2 iterations of GRPO, an eval and an export at the end."""
    return {"apiVersion": "tandem.dev/v1alpha1", "kind": "RLHFJob", "metadata": {"name": name}, "spec": {
        "model": {"path": str(model)},
        "dataset": {"path": str(train), "promptField": "messages", "answerField": "answer",
                    "images": {"maxPerPrompt": 1}},
        "eval": {"dataset": {"path": str(test), "promptField": "messages"}, "every": ITERATIONS, "prompts": 8,
                 "samples": 2},
        "algorithm": {"name": "grpo", "groupSize": 2, "lr": 1e-3, "iterations": ITERATIONS},
        "replicas": 1, "gpusPerPod": 0, "trainer": {"globalBatchSize": 8, "microBatchSize": 4},
        "rollout": {"maxTokens": 6, "promptsPerIteration": 4, "betweenRollouts": "keep"},
        "rewards": [{"type": "answerMatch", "weight": 1.0}],
        "volumes": [{"name": "out", "mountPath": "/out", "hostPath": str(root / "volume")}],
        "export": {"path": "/out/hf", "every": ITERATIONS},
        "checkpointEngine": {"shmSize": "1Gi", "transport": "tcp", "shardSizeMiB": 64},
        "failurePolicy": {"maxRestarts": 0}}}


def test_a_vlm_trains_on_pictures_and_its_export_loads_everywhere(tmp_path: Path) -> None:
    name = "e2e-vlm"
    job = vlm_job(tmp_path, name)
    run_ok(run_cmd(job, tmp_path))
    runs = tmp_path / "runs" / name
    rows = [json.loads(line) for line in (runs / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == list(range(ITERATIONS))
    for r in rows:
        assert r["engine"] == "hf" and r["completions"] == 8 and r["rows_refused"] == 1, r
        assert r["mismatch_kl"] < 1e-8, r  # vLLM sampled with the trainer's exact log-probs, pictures and all
    log = (runs / "logs" / f"{name}-0-trainer.log").read_text()
    assert "train.jsonl: row 13 refused: " in log and "images/gone.png: no such file" in log
    assert "1 of 13 rows refused; the job goes on with the rest" in log
    assert_export_loads_in_both(tmp_path / "volume" / "hf" / f"iteration-{ITERATIONS}", tmp_path)
    assert not processes_of(tmp_path / "runs"), "processes left running"


def assert_export_loads_in_both(export: Path, tmp_path: Path, render: Any = None) -> None:
    """transformers loads `export` with nothing missing or unexpected, and vLLM started on it greedy-decodes a
    picture prompt to transformers' tokens (transformers' own generate: a Qwen2.5-VL's 3-D positions from its
    processor). `render(processor, messages)`: the prompt's text (default: the processor's chat template)."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from tandem.sidecars.rollout_engine.engine import EngineConfig, RolloutEngine
    from tandem.sidecars.rollout_engine.sampling import SamplingOptions
    from tandem.sidecars.vlm_demo import shapes, warmup

    model, info = AutoModelForImageTextToText.from_pretrained(export, dtype=torch.float32, output_loading_info=True)
    assert not any(info.values()), info
    processor = AutoProcessor.from_pretrained(export)
    picture = shapes.render(random.Random(5))
    messages = warmup.messages(picture.question)
    text = render(processor, messages) if render is not None else \
        processor.apply_chat_template(messages, add_generation_prompt=True)
    inputs = processor(images=[picture.image], text=text, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=6, min_new_tokens=6, do_sample=False,
                             suppress_tokens=[model.config.image_token_id])
    want = out[0, inputs["input_ids"].shape[1]:].tolist()
    engine = RolloutEngine(EngineConfig(shm_root=tmp_path / "shm", job="export-check", max_model_len=256))
    try:
        engine.start(str(export), dummy=False)
        ids = processor.tokenizer(text, add_special_tokens=False)["input_ids"]
        got = engine.generate([ids], SamplingOptions(temperature=0.0, max_tokens=6, min_tokens=6),
                              images=[[picture.image]])
        assert got[0][0].token_ids == want
    finally:
        engine.terminate()
