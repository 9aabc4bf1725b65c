"""End to end: `tandem run examples/smollm2-tools.yaml` and `smollm2-agent.yaml`, shortened: multi-turn GRPO.

SmolLM2-135M-Instruct on multi-digit arithmetic with `rollout.environment: {type: tools, tools: [calculator]}`,
asynchronously (`maxStaleness: 1` on the pod's own rollout, kept up while the trainer trains): the rollout
sidecar's driver runs every trajectory on the live vLLM (the tool's schema in a Hermes system prompt, each
call answered with a tool message) while the trainer trains on the previous batch, on the model's tokens
only. Checked: the job finishes; the model called the tool and its answers reached the model (in the
context of a later turn: `tool_results_mean`, errors left out); the first batch, sampled
by the weights it trains, has the trainer's log-probs of the model's tokens (computed over whole trajectories
with the tool messages in the context) equal to what vLLM sampled them with (token in, token out: a
re-tokenized turn or a shifted mask would separate them); the later ones are one version stale, as the bound
allows, and their log-probs differ by one step's change only.
The agent job's trajectories are made by examples/arith-agent/arith_agent.py, an `openai` client loop loaded
from the job's pythonPath, through the rollout's OpenAI-compatible endpoint: the same log-prob check holds for
the calls it recorded, its rewards are the `environment` reward, and its eval runs the agent too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_tandem_run import processes_of, run_cmd, run_ok

pytestmark = [pytest.mark.e2e, pytest.mark.vllm, pytest.mark.megatron, pytest.mark.etcd]

EXAMPLES = Path(__file__).parents[2] / "examples"
NAME = "e2e-tools"
ITERATIONS = 2
MISMATCH = 1e-3  # mean |log p_trainer - log p_rollout| of the model's tokens; ~1e-5 when the weights agree
STALE_MISMATCH = 0.3  # the same one version apart (one step at lr 1e-5: ~0.01-0.03)


def tools_job(model: Path) -> dict[str, Any]:
    job: dict[str, Any] = yaml.safe_load((EXAMPLES / "smollm2-tools.yaml").read_text())
    spec = job["spec"]
    job["metadata"]["name"] = NAME
    spec["model"]["path"] = str(model)
    spec["dataset"]["path"] = str(EXAMPLES / "arith-tools" / "train.jsonl")
    del spec["eval"]
    spec["algorithm"].update(iterations=ITERATIONS, maxStaleness=1, tisCap=2.0)
    spec["rollout"].update(promptsPerIteration=2, maxTokens=48)  # 2 x 4: the train step is most of the time
    spec["rollout"]["environment"].update(maxTurns=2, maxTotalTokens=160)
    return job


def test_asynchronous_multi_turn_grpo_with_the_calculator(tmp_path: Path) -> None:
    from tandem.cli import pretrained

    run_ok(run_cmd(tools_job(pretrained.fetch("smollm2-135m")), tmp_path))
    rows = [json.loads(x) for x in (tmp_path / "runs" / NAME / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == list(range(ITERATIONS))
    for r in rows:
        assert r["completions"] == 8 and 1.0 <= r["turns_mean"] <= 2.0, r
        assert r["tool_results_mean"] <= r["tool_calls_mean"] and 0.0 <= r["tool_error_frac"] <= 1.0, r
        assert r["staleness_max"] <= 1 and "batch_version" in r, r
        assert r["mismatch_mean"] < (MISMATCH if r["staleness_max"] == 0 else STALE_MISMATCH), r
    # the model called the calculator, and its answers (not errors) were in the context of a later turn
    assert sum(r["tool_calls_mean"] for r in rows) > 0 and sum(r["tool_results_mean"] for r in rows) > 0, rows
    assert rows[0]["staleness_max"] == 0, rows[0]  # the first batch is sampled by the weights it trains
    # the producer generates the next batch while the trainer trains this one: stale by one version
    assert any(r["staleness_max"] == 1 for r in rows[1:]), [r["staleness_hist"] for r in rows]
    assert not processes_of(tmp_path / "runs"), "processes left running"


def agent_job(model: Path) -> dict[str, Any]:
    job: dict[str, Any] = yaml.safe_load((EXAMPLES / "smollm2-agent.yaml").read_text())
    spec = job["spec"]
    job["metadata"]["name"] = "e2e-agent"
    spec["model"]["path"] = str(model)
    for key, rel in (("dataset", "arith-tools/train.jsonl"),):
        spec[key]["path"] = str(EXAMPLES / rel)
    spec["eval"] = {"dataset": {"path": str(EXAMPLES / "arith-tools" / "test.jsonl"), "promptField": "messages"},
                    "every": 1, "prompts": 2, "samples": 1, "temperature": 0.0}
    spec["algorithm"].update(iterations=1)
    # 1 prompt x 4: SmolLM2's train step on one core costs ~9 s per trajectory (most of this run's time); this run
    # asserts the agent's path (its trajectories, rewards and eval), not how often it calls the tool
    spec["rollout"].update(promptsPerIteration=1, maxTokens=48)
    environment = spec["rollout"]["environment"]
    environment.update(pythonPath=[str(EXAMPLES / "arith-agent")], kwargs={"max_calls": 2}, maxTurns=2,
                       maxTotalTokens=160)
    return job


def test_multi_turn_grpo_with_an_openai_agent(tmp_path: Path) -> None:
    from tandem.cli import pretrained

    run_ok(run_cmd(agent_job(pretrained.fetch("smollm2-135m")), tmp_path))
    out = tmp_path / "runs" / "e2e-agent"
    [row] = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert row["completions"] == 4 and 1.0 <= row["turns_mean"] <= 2.0, row
    assert row["mismatch_mean"] < MISMATCH, row
    assert set(row["reward_components"]) == {"environment"}, row  # the agent's own reward
    evals = [json.loads(x) for x in (out / "eval.jsonl").read_text().splitlines()]
    assert [e["iteration"] for e in evals] == [0, 1] and all("tool_calls_mean" in e for e in evals), evals
    assert not processes_of(tmp_path / "runs"), "processes left running"
