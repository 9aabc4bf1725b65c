"""End to end with Qwen2.5-VL over turns: `tandem run` trains it on pictures (grids of patches, 3-D positions) in
conversations where an environment answers with a picture, and its export loads in transformers and in vLLM alike.

A tiny Qwen2.5-VL built from a config (tests/rollout_engine/tiny_model.py's `save_qwen_vl`, made to end its turns
with `end_turns`), the VLM demo's picture split (shapes.py: 64x64 pictures, 4 image tokens each here), and the
example environment examples/shapes-look/look_again.py (rollout.environment type custom, loaded from the job's
pythonPath): after the first reply it shows the middle of the row's picture enlarged and asks again.
`trainer.engine` is left at auto, which picks hf for model_type qwen2_5_vl; prompts are shared by their completions
(trainer.sharePrompts, the default) and packed several to a row. Asserted: every iteration trains on all its
trajectories; the environment's pictures reached the model (`env_pictures_mean`, turns past the first) and the live
vLLM sampled every model token with the trainer's log-probs over the whole conversation (mismatch KL per token at a
text job's size: both pictures and their 3-D positions reach both sides, the environment's tokens masked out); the
held-out eval ran the same conversations; the exported directory loads in transformers with nothing missing, and
vLLM started on it greedy-decodes a picture prompt to transformers' tokens.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

import pytest

# remove_shm_dirs (autouse: each test's /dev/shm dirs go) is a fixture
from test_tandem_run import USED, processes_of, remove_shm_dirs, run_cmd, run_ok  # noqa: F401
from test_vlm_run import assert_export_loads_in_both, picture_job

pytestmark = [pytest.mark.e2e, pytest.mark.vllm, pytest.mark.etcd]

ITERATIONS = 2
EXAMPLES = Path(__file__).parents[2] / "examples"


def qwen_vl_job(root: Path, name: str) -> dict[str, Any]:
    sys.path.insert(0, str(Path(__file__).parents[1] / "rollout_engine"))
    import tiny_model

    from tandem.sidecars.vlm_demo import shapes, warmup

    USED.append(name)
    rng = random.Random(7)
    calibration = [shapes.render(rng) for _ in range(6)]
    model = tiny_model.end_turns(tiny_model.save_qwen_vl(root / "model"), warmup.messages(calibration[0].question),
                                 [c.image for c in calibration])
    train = shapes.write_split(root / "data", "train", 12, seed=1)
    test = shapes.write_split(root / "data", "test", 8, seed=2)
    job: dict[str, Any] = picture_job(name, model, train, test, root)  # test_vlm_run's, on this model
    job["spec"]["rollout"]["environment"] = {"type": "custom", "entryPoint": "look_again:LookAgain",
                                             "pythonPath": [str(EXAMPLES / "shapes-look")], "maxTurns": 2,
                                             "maxTotalTokens": 256, "maxPictures": 1}
    return job


def test_qwen_vl_trains_over_turns_with_an_environments_pictures(tmp_path: Path) -> None:
    name = "e2e-qwen-vl"
    run_ok(run_cmd(qwen_vl_job(tmp_path, name), tmp_path))
    runs = tmp_path / "runs" / name
    rows = [json.loads(line) for line in (runs / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == list(range(ITERATIONS))
    for r in rows:
        assert r["engine"] == "hf" and r["completions"] == 8 and r.get("env_pictures_refused", 0) == 0, r
        assert r["mismatch_kl"] < 1e-8, r  # vLLM sampled with the trainer's log-probs, both pictures and positions
    print(f"\nmismatch KL per iteration: {[r['mismatch_kl'] for r in rows]}; the environment's pictures per "
          f"trajectory: {[r.get('env_pictures_mean', 0) for r in rows]}; turns: {[r['turns_mean'] for r in rows]}")
    assert sum(r.get("env_pictures_mean", 0) for r in rows) > 0 and max(r["turns_mean"] for r in rows) > 1, rows
    assert (runs / "eval-samples.jsonl").read_text().strip(), "the held-out eval ran the conversations"
    assert_export_loads_in_both(tmp_path / "volume" / "hf" / f"iteration-{ITERATIONS}", tmp_path,
                                render=lambda processor, messages: processor.tokenizer.apply_chat_template(
                                    messages, tokenize=False, add_generation_prompt=True))
    assert not processes_of(tmp_path / "runs"), "processes left running"
