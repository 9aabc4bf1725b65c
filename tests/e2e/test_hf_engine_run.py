"""End to end on the hf trainer engine: `tandem run` trains a Gemma (a family Megatron has no mapping for).

The toy task with a Gemma of the toy's size (GeGLU, scaled embeddings, 1 + w RMSNorm, tied head) warmed up
to ~25% of sums. `trainer.engine` is left at auto, which picks hf for model_type gemma. Two pods (replicas
2): the two trainer ranks shard the model with FSDP2 over gloo; rank 0 publishes the model's own state dict
(no conversion) and both pods' vLLMs load each version in place. Proof that the versions are whole and
right: the live vLLM's sampling log-probs equal the trainer's (mismatch), every exported version loads in
transformers and answers the probe exactly as the live vLLM did with it, and the greedy answer changes as
the weights do."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

# remove_shm_dirs (autouse: each test's /dev/shm dirs go) is a fixture
from test_tandem_run import demo_job, processes_of, remove_shm_dirs, run_cmd, run_ok  # noqa: F401
from test_two_pods import assert_exports_answer_as_live, run_two_pods

pytestmark = [pytest.mark.e2e, pytest.mark.vllm, pytest.mark.etcd]

ITERATIONS = 4


@pytest.fixture(scope="module")
def gemma_toy() -> Path:
    from tandem.sidecars.toy.build import build_toy

    root = Path(os.environ.get("TANDEM_CACHE", Path.home() / ".cache" / "tandem")) / "test-toy-gemma"
    return build_toy(root, seed=0, warmup_steps=60, max_operand=10, family="gemma").root


def test_gemma_trains_on_the_hf_engine_across_two_pods(gemma_toy: Path, tmp_path: Path) -> None:
    assert json.loads((gemma_toy / "model" / "config.json").read_text())["model_type"] == "gemma"
    _, rows = run_two_pods(gemma_toy, "e2e-hf-engine", tmp_path, iterations=ITERATIONS, lr=2e-3)
    assert [r["iteration"] for r in rows] == list(range(ITERATIONS))
    for r in rows:
        assert r["engine"] == "hf" and r["layout"] == {"tp": 1, "pp": 1, "dp": 2, "ep": 1}, r
        assert r["rollouts"] == 2 and r["completions"] == 64
        assert r["mismatch_mean"] < 1e-4, r  # both vLLMs sampled with exactly the weights the trainer holds
    assert any(r["reward_mean"] > 0 for r in rows)
    assert_exports_answer_as_live(rows, gemma_toy / "model", tmp_path / "volume" / "hf")
    assert not processes_of(tmp_path / "runs"), "processes left running"


@pytest.mark.parametrize("sync", ["adapter", "merged"])
def test_lora_trains_the_toy(sync: str, tmp_path: Path) -> None:
    """trainer.lora on the demo's Qwen2 toy (a Megatron family: lora makes auto pick hf). sync adapter: each
    version carries the adapters alone, which the live vLLM serves as a LoRA adapter over the base model;
    merged: the merged weights, loaded in place. Either way vLLM samples with the trainer's exact log-probs,
    and an adapter version is a small fraction of a whole one."""
    from tandem.sidecars.toy.build import build_toy

    toy = build_toy(Path(os.environ.get("TANDEM_CACHE", Path.home() / ".cache" / "tandem")) / "test-toy-tied",
                    seed=0, warmup_steps=40, max_operand=10, tied=True).root
    job = demo_job(toy, f"e2e-lora-{sync}")
    job["spec"]["algorithm"].update(iterations=3, lr=5e-3)
    job["spec"]["trainer"]["lora"] = {"rank": 8, "alpha": 16, "sync": sync}
    job["spec"]["rollout"]["promptsPerIteration"] = 8
    run_ok(run_cmd(job, tmp_path))
    path = tmp_path / "runs" / f"e2e-lora-{sync}" / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [0, 1, 2]
    for r in rows:
        assert r["engine"] == "hf" and r["mismatch_mean"] < 1e-4, r
    whole = sum(f.stat().st_size for f in (toy / "model").glob("*.safetensors"))
    small = [r["version_bytes"] < whole / 5 for r in rows]
    assert all(small) if sync == "adapter" else not any(small), ([r["version_bytes"] for r in rows], whole)
    assert len({r["probe"]["greedy"] for r in rows}) > 1 or rows[-1]["kl"] > 0  # the adapters moved the policy
    assert not processes_of(tmp_path / "runs"), "processes left running"
