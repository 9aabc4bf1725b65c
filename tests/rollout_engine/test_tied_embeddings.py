"""Tied input/output embeddings through publish -> in-place update of a live vLLM (real engine, CPU).

A HuggingFace checkpoint of a tied model carries no `lm_head.weight`, so the version the trainer
publishes has none either. After an in-place update from such a version the live engine must
generate exactly what transformers generates from the same weights — before the fix the output
head kept its dummy-start values. The untied case is covered by test_rollout_engine.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tiny_model
import torch

from tandem.checkpoint_engine.versions import version_writer
from tandem.sidecars.rollout_engine.engine import EngineConfig, RolloutEngine
from tandem.sidecars.rollout_engine.sampling import SamplingOptions

pytestmark = [pytest.mark.vllm]
PROMPTS = ["alpha beta gamma", "one two three four", "sigma tau 7", "omega psi chi"]
GREEDY = SamplingOptions(temperature=0.0, max_tokens=12, ignore_eos=True)


def hf_state(model: Any) -> list[tuple[str, torch.Tensor]]:
    """What a saved tied checkpoint holds (and the trainer publishes): no lm_head.weight."""
    return [(k, v.contiguous()) for k, v in model.state_dict().items() if k != "lm_head.weight"]


def hf_greedy(model: Any, tokenizer: Any) -> list[list[int]]:
    out = []
    for p in PROMPTS:
        ids = tokenizer(p, return_tensors="pt").input_ids
        with torch.no_grad():
            gen = model.generate(ids, max_new_tokens=GREEDY.max_tokens, do_sample=False, pad_token_id=1,
                                 eos_token_id=None)
        out.append(gen[0, ids.shape[1]:].tolist())
    return out


@pytest.fixture(scope="module")
def tied_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RolloutEngine, Path]]:
    root = tmp_path_factory.mktemp("tied")
    start = tiny_model.random_model(seed=0, tied=True)
    start.save_pretrained(root / "model")
    tiny_model.build_tokenizer(root / "model")
    engine = RolloutEngine(EngineConfig(shm_root=root / "shm", job="tied", max_model_len=256))
    engine.start(str(root / "model"), dummy=True)
    yield engine, root
    engine.terminate()


@pytest.mark.parametrize("seed", [21, 22])
def test_tied_update_generates_like_transformers(tied_engine: tuple[RolloutEngine, Path], seed: int) -> None:
    from transformers import AutoTokenizer

    engine, root = tied_engine
    model = tiny_model.random_model(seed=seed, tied=True)
    assert model.config.tie_word_embeddings and model.lm_head.weight is model.model.embed_tokens.weight
    names = [n for n, _ in hf_state(model)]
    assert "lm_head.weight" not in names
    wrote = version_writer.write_version(root / "versions", "tied", seed, hf_state(model))
    report = engine.update_from_path(wrote.path)
    assert all(w["retied"] for w in report.workers)
    sums = engine.llm.collective_rpc("tandem_logits_weight_sum")[0]
    assert sums["head"] == pytest.approx(sums["embed"]), "the output head must follow the new embedding"
    assert sums["embed"] == pytest.approx(float(model.model.embed_tokens.weight.detach().sum()), rel=1e-4, abs=1e-3)
    tokenizer = AutoTokenizer.from_pretrained(root / "model")
    live = [c[0].token_ids for c in engine.generate(PROMPTS, GREEDY)]
    assert live == hf_greedy(model, tokenizer)
