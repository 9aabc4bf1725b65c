"""End to end: a 2-pod `tandem run` whose trainer ranks span both pods, on a tied-embedding model.

Each pod holds one trainer rank and one vLLM (replicas 2, TP 1: data parallel 2 across the pods, as two
nodes of one GPU each would run). The ranks meet over gloo by the pods' addresses, train one model with
Megatron's distributed optimizer (its state sharded over the two ranks), and rank 0 publishes each
version, which both pods' rollouts load. The model ties its output layer to the embedding (as
SmolLM2 and the small Qwen models do): a version carries no lm_head, and every exported version
loads in transformers and answers the probe exactly as the live vLLM did with it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from safetensors import safe_open
from test_pretrained import greedy_text

# remove_shm_dirs (autouse: each test's /dev/shm dirs go) is a fixture
from test_tandem_run import demo_job, processes_of, remove_shm_dirs, run_cmd, run_ok  # noqa: F401

pytestmark = [pytest.mark.e2e, pytest.mark.vllm, pytest.mark.megatron, pytest.mark.etcd]

ITERATIONS = 3


@pytest.fixture(scope="module")
def tied_toy() -> Path:
    from tandem.sidecars.toy.build import build_toy

    root = Path(os.environ.get("TANDEM_CACHE", Path.home() / ".cache" / "tandem")) / "test-toy-tied"
    return build_toy(root, seed=0, warmup_steps=40, max_operand=10, tied=True).root


def run_two_pods(toy: Path, name: str, tmp_path: Path, **algorithm: Any) -> tuple[Path, list[dict[str, Any]]]:
    """The demo job on `toy` with replicas 2 (a trainer rank in each pod), 8 prompts per iteration and every
    version exported to a volume; (its run directory, its metrics rows)."""
    job = demo_job(toy, name)
    spec = job["spec"]
    spec["replicas"] = 2
    spec["algorithm"].update(algorithm)
    spec["rollout"]["promptsPerIteration"] = 8
    spec["volumes"] = [{"name": "out", "mountPath": "/out", "hostPath": str(tmp_path / "volume")}]
    spec["export"] = {"path": "/out/hf", "every": 1}
    run_ok(run_cmd(job, tmp_path))
    runs = tmp_path / "runs" / name
    return runs, [json.loads(line) for line in (runs / "metrics.jsonl").read_text().splitlines()]


def assert_exports_answer_as_live(rows: list[dict[str, Any]], model_dir: Path, exports: Path) -> None:
    """Every exported version but the last loads in transformers without a tied head and answers the probe as
    the live vLLM did with it (iteration it + 1's probe was generated with the version exported after it)."""
    from transformers import AutoTokenizer

    probe = AutoTokenizer.from_pretrained(model_dir)(rows[0]["probe"]["prompt"])["input_ids"]
    for it in range(len(rows) - 1):
        out = exports / f"iteration-{it + 1}"
        assert rows[it]["export"]["version"] == rows[it + 1]["rollout_version"]
        with safe_open(str(out / "model.safetensors"), "pt") as f:
            assert "lm_head.weight" not in set(f.keys())
        assert greedy_text(out, probe, 12).strip() == rows[it + 1]["probe"]["greedy"].strip()


def test_trainer_ranks_in_two_pods_train_a_tied_model(tied_toy: Path, tmp_path: Path) -> None:
    assert json.loads((tied_toy / "model" / "config.json").read_text())["tie_word_embeddings"] is True
    runs, rows = run_two_pods(tied_toy, "e2e-two-pods", tmp_path, iterations=ITERATIONS)
    assert [r["iteration"] for r in rows] == list(range(ITERATIONS))
    for r in rows:
        assert r["layout"] == {"tp": 1, "pp": 1, "dp": 2, "ep": 1}, r["layout"]  # a rank in each pod
        assert r["rollouts"] == 2 and r["completions"] == 64
        assert r["mismatch_mean"] < 1e-4, r  # both vLLMs sampled with the weights the trainer holds
    assert {p.name for p in (runs / "logs").iterdir()} >= {f"e2e-two-pods-{i}-{c}.log" for i in (0, 1)
                                                          for c in ("trainer", "rollout")}
    assert_exports_answer_as_live(rows, tied_toy / "model", tmp_path / "volume" / "hf")
    assert not processes_of(tmp_path / "runs"), "processes left running"
