"""Fixtures of the rollout engine's tests: the tiny Qwen2 on disk and ONE vLLM engine shared by the whole session
(starting one costs 30-60 s on these machines), with the publisher that feeds it.

Callers: the tests in tests/rollout_engine/ (their worker group, "tests/rollout_engine" in tests/conftest.py, keeps
them on one worker, so the engine starts once). The etcd server, `shm_root`, `job` and `make_registry` come from
tests/conftest.py.
"""

from __future__ import annotations

import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import tiny_model  # noqa: E402

from tandem.checkpoint_engine.etcd.sync_registry import SyncRegistry  # noqa: E402


@pytest.fixture(scope="session")
def tiny_dir() -> Path:
    """A saved tiny Qwen2 (seed 0 weights) with a locally trained tokenizer."""
    root = Path(tempfile.mkdtemp(prefix="tandem-ce-model-"))
    return tiny_model.save_model(root / "qwen2-tiny", seed=0)


@pytest.fixture(scope="session")
def engine_shm() -> Iterator[Path]:
    import shutil

    root = Path("/dev/shm") / f"tandem-engine-{uuid.uuid4().hex[:8]}"
    root.mkdir()
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def live_engine(etcd_server: Any, tiny_dir: Path, engine_shm: Path) -> Iterator[Any]:
    """The session's one vLLM engine (dummy weights at start), job "live" in namespace "test"."""
    from tandem.sidecars.rollout_engine.engine import EngineConfig, RolloutEngine

    reg = SyncRegistry(etcd_server.endpoint, "test", "live", "pod0", "rollout", ttl=5, timeout=2.0).connect()
    engine = RolloutEngine(EngineConfig(shm_root=engine_shm, job="live", max_model_len=256), registry=reg)
    engine.start(str(tiny_dir), dummy=True)
    yield engine
    engine.terminate()
    reg.close()


@pytest.fixture(scope="session")
def live_publisher(etcd_server: Any, engine_shm: Path) -> Iterator[Any]:
    from tandem.checkpoint_engine.service.publisher import Publisher

    reg = SyncRegistry(etcd_server.endpoint, "test", "live", "pod0", "trainer", ttl=5, timeout=2.0).connect()
    pub = Publisher(engine_shm, "live", reg, keep=2)
    pub.recover()
    yield pub
    pub.close()
