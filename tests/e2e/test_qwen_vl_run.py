"""End to end with Qwen2.5-VL: `tandem run` trains it on pictures (grids of patches, 3-D positions), and its export
loads in transformers and in vLLM alike.

A tiny Qwen2.5-VL built from a config (tests/rollout_engine/tiny_model.py's `save_qwen_vl`), the VLM demo's picture
split (shapes.py: 64x64 pictures, 4 image tokens each here). `trainer.engine` is left at auto, which picks hf for
model_type qwen2_5_vl; prompts are shared by their completions (trainer.sharePrompts, the default) and packed
several to a row. Asserted: every iteration trains on all its completions; the live vLLM samples with the
trainer's log-probs (mismatch KL per token at a text job's size: the pictures and the 3-D positions reach both);
the exported directory loads in transformers with nothing missing, and vLLM started on it greedy-decodes a picture
prompt to transformers' tokens.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

# remove_shm_dirs (autouse: each test's /dev/shm dirs go) is a fixture
from test_tandem_run import USED, processes_of, remove_shm_dirs, run_cmd, run_ok  # noqa: F401
from test_vlm_run import assert_export_loads_in_both, picture_job

pytestmark = [pytest.mark.e2e, pytest.mark.vllm, pytest.mark.etcd]

ITERATIONS = 2


def qwen_vl_job(root: Path, name: str) -> dict[str, Any]:
    sys.path.insert(0, str(Path(__file__).parents[1] / "rollout_engine"))
    import tiny_model

    from tandem.sidecars.vlm_demo import shapes

    USED.append(name)
    model = tiny_model.save_qwen_vl(root / "model")
    train = shapes.write_split(root / "data", "train", 12, seed=1)
    test = shapes.write_split(root / "data", "test", 8, seed=2)
    job: dict[str, Any] = picture_job(name, model, train, test, root)  # test_vlm_run's, on this model
    return job


def test_qwen_vl_trains_on_pictures_and_its_export_loads_everywhere(tmp_path: Path) -> None:
    name = "e2e-qwen-vl"
    run_ok(run_cmd(qwen_vl_job(tmp_path, name), tmp_path))
    rows = [json.loads(line) for line in (tmp_path / "runs" / name / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == list(range(ITERATIONS))
    for r in rows:
        assert r["engine"] == "hf" and r["completions"] == 8, r
        assert r["mismatch_kl"] < 1e-8, r  # vLLM sampled with the trainer's log-probs, pictures and positions too
    print(f"\nmismatch KL per iteration: {[r['mismatch_kl'] for r in rows]}")
    assert_export_loads_in_both(tmp_path / "volume" / "hf" / f"iteration-{ITERATIONS}", tmp_path,
                                render=lambda processor, messages: processor.tokenizer.apply_chat_template(
                                    messages, tokenize=False, add_generation_prompt=True))
    assert not processes_of(tmp_path / "runs"), "processes left running"
