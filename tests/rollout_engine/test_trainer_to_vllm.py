"""Tied and untied embeddings through the whole weight path: the real Megatron trainer's own export ->
a published version in shared memory -> in-place update of a live vLLM (CPU) -> greedy tokens; and the
published version -> `hf_export.export_version` -> transformers.

The trainer runs in a subprocess (tests/trainer/pipeline_worker.py: Megatron's parallel state and the
CPU compatibility layer are per process, and vLLM forks its engine from this one). It publishes version
0 (the loaded HF weights) and version 1 (after two training steps) and saves its own logits and greedy
continuations of the prompts. Per case (a tied and an untied Qwen2 of the same shape as the session's
live engine):

* version 0: what the trainer exported is exactly the HF checkpoint (a tied one has no lm_head.weight);
  vLLM loaded from it decodes greedily what transformers decodes from the HF model, and what Megatron
  decodes, and reports the log-probs transformers computes for those tokens;
* version 1: the exported HF directory loads in transformers with Megatron's own logits, and vLLM
  loaded from the trained version decodes like transformers on that directory (and unlike version 0).

The untied case runs on the session's live engine (tests/rollout_engine/conftest.py); the tied case
needs an engine started from a tied config, one per module.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import tiny_model
import torch

from tandem.checkpoint_engine.versions import layout
from tandem.checkpoint_engine.versions.hf_export import export_version
from tandem.sidecars.rollout_engine.engine import EngineConfig, RolloutEngine
from tandem.sidecars.rollout_engine.sampling import SamplingOptions

pytestmark = [pytest.mark.vllm, pytest.mark.megatron, pytest.mark.etcd]

WORKER = Path(__file__).parents[1] / "trainer" / "pipeline_worker.py"
PROMPTS = ["alpha beta gamma", "one two three four", "sigma tau 7", "omega psi chi", "nine 41 delta"]
NEW_TOKENS = 10
GREEDY = SamplingOptions(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
SEEDS = {"tied": 41, "untied": 42}
LOGIT_TOL = 1e-4  # Megatron vs transformers, float32 on CPU (measured ~1e-6)
LOGPROB_TOL = 1e-3  # vLLM's kernels vs transformers, float32 on CPU


@dataclass
class Case:
    tied: bool
    model_dir: Path
    prompts: list[list[int]]
    trainer: dict[str, Any]  # what pipeline_worker saved: losses, v0/v1 {path, logits, greedy}


@pytest.fixture(scope="module")
def shm() -> Iterator[Path]:
    root = Path("/dev/shm") / f"tandem-pipeline-{uuid.uuid4().hex[:8]}"
    root.mkdir()
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory, shm: Path) -> dict[str, Case]:
    """Both models saved, the trainer run once over both in a subprocess, its results loaded."""
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("pipeline")
    specs, dirs = [], {}
    for name, seed in SEEDS.items():
        model_dir = root / name
        tiny_model.random_model(seed=seed, tied=name == "tied").save_pretrained(model_dir)
        tiny_model.build_tokenizer(model_dir)
        dirs[name] = model_dir
    tok = AutoTokenizer.from_pretrained(dirs["tied"])
    prompts = [tok(p).input_ids for p in PROMPTS]
    for name, model_dir in dirs.items():
        specs.append({"model_dir": str(model_dir), "shm_root": str(shm), "job": name, "prompts": prompts,
                      "max_new_tokens": NEW_TOKENS, "out": str(root / f"{name}.pt")})
    (root / "spec.json").write_text(json.dumps(specs))
    proc = subprocess.run([sys.executable, str(WORKER), str(root / "spec.json")], capture_output=True, text=True,
                          timeout=600, cwd=WORKER.parent)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return {name: Case(name == "tied", dirs[name], prompts, torch.load(root / f"{name}.pt", weights_only=False))
            for name in SEEDS}


@pytest.fixture(scope="module")
def tied_engine(cases: dict[str, Case], shm: Path) -> Iterator[RolloutEngine]:
    """A live vLLM started (dummy weights) from the tied model's config."""
    engine = RolloutEngine(EngineConfig(shm_root=shm, job="tied", max_model_len=256))
    engine.start(str(cases["tied"].model_dir), dummy=True)
    yield engine
    engine.terminate()


def engine_for(case: Case, request: pytest.FixtureRequest) -> RolloutEngine:
    engine: RolloutEngine = request.getfixturevalue("tied_engine" if case.tied else "live_engine")
    return engine


def hf_greedy(model: Any, prompts: list[list[int]]) -> tuple[list[list[int]], list[list[float]]]:
    """Greedy tokens by argmax of full forward passes, and the log-prob of each chosen token."""
    tokens, logprobs = [], []
    for prompt in prompts:
        ids, lps = list(prompt), []
        with torch.no_grad():
            for _ in range(NEW_TOKENS):
                last = torch.log_softmax(model(torch.tensor([ids])).logits[0, -1].double(), dim=-1)
                ids.append(int(last.argmax()))
                lps.append(float(last[ids[-1]]))
        tokens.append(ids[len(prompt):])
        logprobs.append(lps)
    return tokens, logprobs


def load_hf(model_dir: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def live_greedy(engine: RolloutEngine, case: Case) -> tuple[list[list[int]], list[list[float]]]:
    out = engine.generate(case.prompts, GREEDY)
    return [c[0].token_ids for c in out], [c[0].logprobs for c in out]


def assert_close_logprobs(got: list[list[float]], want: list[list[float]]) -> None:
    gap = max(abs(a - b) for g, w in zip(got, want, strict=True) for a, b in zip(g, w, strict=True))
    assert gap < LOGPROB_TOL, f"vLLM and transformers log-probs of the greedy tokens differ by {gap}"


@pytest.mark.parametrize("name", list(SEEDS))
def test_trainer_export_of_the_loaded_weights_generates_like_transformers(
    name: str, cases: dict[str, Case], request: pytest.FixtureRequest
) -> None:
    from safetensors.torch import load_file

    case = cases[name]
    v0 = Path(case.trainer["v0"]["path"])
    published = dict(layout.MappedVersion(v0).tensors())
    source = load_file(str(case.model_dir / "model.safetensors"))
    assert ("lm_head.weight" in source) is not case.tied  # a tied HF checkpoint has no output head
    assert sorted(published) == sorted(source), "the trainer must publish exactly the HF checkpoint's tensors"
    for key, tensor in source.items():
        assert torch.equal(published[key], tensor), key
    tied_params = "output_layer.weight" not in case.trainer["local_names"]
    assert tied_params is case.tied, "Megatron shares the output layer with the embedding iff the model is tied"

    engine = engine_for(case, request)
    report = engine.update_from_path(v0)
    assert [w["retied"] for w in report.workers] == [case.tied]
    want, want_lps = hf_greedy(load_hf(case.model_dir), case.prompts)
    got, got_lps = live_greedy(engine, case)
    assert got == want, "vLLM after the update must decode greedily what transformers decodes"
    assert case.trainer["v0"]["greedy"] == want, "Megatron's own greedy decode must agree too"
    assert_close_logprobs(got_lps, want_lps)


@pytest.mark.parametrize("name", list(SEEDS))
def test_trained_version_exports_to_transformers_and_vllm_alike(
    name: str, cases: dict[str, Case], request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    from safetensors import safe_open

    case = cases[name]
    trainer = case.trainer
    assert trainer["losses"][-1] < trainer["losses"][0], trainer["losses"]
    v1 = Path(trainer["v1"]["path"])
    out = export_version(v1, case.model_dir, tmp_path / "iteration-1")
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is case.tied
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert ("lm_head.weight" in set(f.keys())) is not case.tied

    # transformers on the exported directory computes the trainer's own logits
    model = load_hf(out)
    with torch.no_grad():
        for i, prompt in enumerate(case.prompts):
            hf = model(torch.tensor([prompt])).logits[0]
            gap = (hf - trainer["v1"]["logits"][i]).abs().max().item()
            assert gap < LOGIT_TOL, f"prompt {i}: transformers vs Megatron logits differ by {gap}"
            moved = (trainer["v1"]["logits"][i] - trainer["v0"]["logits"][i]).abs().max().item()
            assert moved > 0.05, f"prompt {i}: training barely changed the logits ({moved})"

    engine = engine_for(case, request)
    report = engine.update_from_path(v1)
    assert report.version == 1 and [w["retied"] for w in report.workers] == [case.tied]
    want, want_lps = hf_greedy(model, case.prompts)
    got, got_lps = live_greedy(engine, case)
    assert got == want, "vLLM on the trained version must decode what transformers decodes from its export"
    assert trainer["v1"]["greedy"] == want
    assert got != trainer["v0"]["greedy"], "the trained weights must change some greedy continuation"
    assert_close_logprobs(got_lps, want_lps)
    if case.tied:
        sums = engine.llm.collective_rpc("tandem_logits_weight_sum")[0]
        assert sums["head"] == pytest.approx(sums["embed"]), "the output head must follow the trained embedding"
