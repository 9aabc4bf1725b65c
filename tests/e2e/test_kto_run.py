"""End to end: KTO through `tandem run` (real etcd, vLLM on CPU, megatron-core) on a labelled dataset.

The toy model (~15% of its sums right) trains on its own task's prompts, each once with the right
answer (desirable) and once with a wrong one (undesirable), written by examples/arith/make_kto.py's
`labelled` in the toy's answer format. Nothing is generated for training: the rows come in the seeded
order with their KL probes, and the rollouts load every version and evaluate on held-out sums. Checked:
the loss at each step's start falls from its starting 0.5 (the policy is the reference: r = 0), the
undesirable log-ratio (rewards_rejected, beta r) falls and the desirable one rises above it (the
margin, as DPO's reward_margin: on this toy the wrong answers share their format with the right ones,
so pushing them down at this learning rate drags both, the wrong ones faster), z0 is reported, and
every version reaches the rollouts (each iteration starts on the version the previous one published,
each evaluation runs on the newest, the probe's greedy answer changes)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

# toy and remove_shm_dirs (autouse: each test's /dev/shm dirs go) are fixtures
from test_tandem_run import demo_job, processes_of, remove_shm_dirs, run_cmd, run_ok, toy  # noqa: F401

pytestmark = [pytest.mark.e2e, pytest.mark.vllm, pytest.mark.megatron, pytest.mark.etcd]

ITERATIONS = 12
ROOT = Path(__file__).parents[2]


def make_kto() -> Any:
    """examples/arith/make_kto.py as a module (the generator the example's dataset comes from)."""
    spec = importlib.util.spec_from_file_location("make_kto", ROOT / "examples" / "arith" / "make_kto.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_kto_learns_from_labelled_rows_and_syncs(toy: Path, tmp_path: Path) -> None:  # noqa: F811
    gen = make_kto()
    prompts = [json.loads(line) for line in (toy / "train.jsonl").read_text().splitlines()[:32]]
    train = gen.write(gen.labelled(prompts, " <answer>{answer}</answer>"), tmp_path / "kto.jsonl")
    job = demo_job(toy, "e2e-kto")
    spec = job["spec"]
    spec["algorithm"] = {"name": "kto", "beta": 0.1, "desirableWeight": 1.0, "undesirableWeight": 1.0,
                         "lr": 3e-4, "iterations": ITERATIONS}
    spec["dataset"] = {"path": str(train), "completionField": "completion", "labelField": "label"}
    spec["eval"] = {"dataset": {"path": str(toy / "test.jsonl")}, "every": 6, "prompts": 64}
    spec["rollout"]["promptsPerIteration"] = 32  # rows: 32 examples and their 32 KL probes, one optimizer step
    run_ok(run_cmd(job, tmp_path))
    runs = tmp_path / "runs" / "e2e-kto"

    rows = [json.loads(line) for line in (runs / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == list(range(ITERATIONS))
    for r in rows:
        assert r["completions"] == 32 and r["kl_probes"] == 32
        assert r["desirable_examples"] + r["undesirable_examples"] == 32
        assert r["reward_mean"] == pytest.approx(r["desirable_examples"] / 32)  # the label is the reward
        assert r["prepare_examples"] == 32 and r["kl"] == pytest.approx(r["prepare_kl"]) and r["kl"] >= 0.0
        assert r["update_ok"] == 1.0
    chosen = [r["prepare_rewards_chosen"] for r in rows]
    rejected = [r["prepare_rewards_rejected"] for r in rows]
    loss = [r["prepare_kto_loss"] for r in rows]
    print("rewards chosen", [round(x, 3) for x in chosen], "rejected", [round(x, 3) for x in rejected],
          "loss", [round(x, 4) for x in loss], "z0", [round(r["kl"], 4) for r in rows])
    assert abs(chosen[0]) < 1e-3 and abs(rejected[0]) < 1e-3 and loss[0] == pytest.approx(0.5, abs=1e-3)
    margin = [c - r for c, r in zip(chosen, rejected, strict=True)]
    assert sum(loss[-3:]) / 3 < loss[0] - 0.008, loss
    assert sum(rejected[-3:]) / 3 < -0.1 and sum(margin[-3:]) / 3 > 0.05 + sum(margin[:3]) / 3, (chosen, rejected)
    # every version reached the rollouts: each iteration started on the version the previous one published
    versions = [r["weight_version"] for r in rows]
    assert versions == list(range(versions[0], versions[0] + ITERATIONS))
    assert [r["rollout_version"] for r in rows[1:]] == versions[:-1]
    assert len({r["probe"]["greedy"] for r in rows}) > 1, [r["probe"]["greedy"] for r in rows]
    evals = [json.loads(line) for line in (runs / "eval.jsonl").read_text().splitlines()]
    assert [(e["iteration"], e["version"]) for e in evals] == [(0, versions[0] - 1), (6, versions[5]),
                                                                 (12, versions[11])]
    print("held-out pass@1", [e["pass_at_1"] for e in evals])
    assert not processes_of(tmp_path / "runs"), "processes left running"
