"""Fixtures of the environment tests: one real vLLM on SmolLM2-135M-Instruct (fp32, CPU) for the whole
package, as every test here drives the same engine (the multi-turn driver, the OpenAI endpoint, agents)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="package")
def smollm2() -> Path:
    from tandem.cli import pretrained

    return Path(pretrained.fetch("smollm2-135m"))


@pytest.fixture(scope="package")
def engine(smollm2: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from tandem.sidecars.rollout_engine.engine import EngineConfig, RolloutEngine

    eng = RolloutEngine(EngineConfig(shm_root=tmp_path_factory.mktemp("shm"), job="turns", max_model_len=1024))
    eng.start(str(smollm2), dummy=False)
    yield eng
    eng.terminate()


@pytest.fixture(scope="package")
def tokenizer(smollm2: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2)
