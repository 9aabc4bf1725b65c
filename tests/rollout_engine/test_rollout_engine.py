"""The live vLLM engine (one per session) updated in place from shared memory via etcd.

Real vLLM (CPU), real etcd, real /dev/shm. The expensive comparison (a second, fresh engine
loaded from a saved HF directory) happens once, in test_update_equals_fresh_engine_and_hf.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import tiny_model
import torch

from tandem.checkpoint_engine import errors
from tandem.checkpoint_engine.service.engine_status import Phase
from tandem.checkpoint_engine.versions import layout, version_writer
from tandem.sidecars.rollout_engine.engine import EngineConfig, RolloutEngine
from tandem.sidecars.rollout_engine.sampling import SamplingOptions

pytestmark = [pytest.mark.vllm, pytest.mark.etcd]
GREEDY = SamplingOptions(temperature=0.0, max_tokens=10)
PROMPTS = ["alpha beta gamma", "one two three four"]


def greedy(engine: RolloutEngine) -> list[list[int]]:
    return [c[0].token_ids for c in engine.generate(PROMPTS, GREEDY)]


def hf_greedy(model: Any, tokenizer: Any) -> list[list[int]]:
    out = []
    for p in PROMPTS:
        ids = tokenizer(p, return_tensors="pt").input_ids
        with torch.no_grad():
            gen = model.generate(ids, max_new_tokens=10, do_sample=False, pad_token_id=1)
        out.append(gen[0, ids.shape[1] :].tolist())
    return out


def test_update_equals_fresh_engine_and_hf(
    live_engine: RolloutEngine,
    live_publisher: Any,
    tiny_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Live TP=1 engine updated from shm == a fresh TP=2 engine loaded from the saved HF dir == HF's
    own greedy decode; then the TP=2 engine is updated from shm too (each rank takes its slice)."""
    from transformers import AutoTokenizer

    model = tiny_model.random_model(seed=11)
    saved = tmp_path / "seed11"
    model.save_pretrained(saved)
    tiny_model.build_tokenizer(saved)
    before = greedy(live_engine)
    rep = live_publisher.publish(None, model.state_dict().items())
    upd = live_engine.update()
    assert upd.version == rep.version == live_engine.version and upd.bytes == rep.bytes
    live = greedy(live_engine)
    assert live != before, "new weights must change the greedy output of the dummy engine"
    tokenizer = AutoTokenizer.from_pretrained(saved)
    assert hf_greedy(model, tokenizer) == live

    # two CPU workers: one core each, none reserved (the live engine keeps running beside it)
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0|1")
    monkeypatch.setenv("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    fresh = RolloutEngine(EngineConfig(shm_root=tmp_path, job="fresh", tensor_parallel=2, max_model_len=256))
    fresh.start(str(saved), dummy=False)
    try:
        assert greedy(fresh) == live
        other = tiny_model.random_model(seed=12)
        wrote = version_writer.write_version(tmp_path / "shm", "tp2", 1, other.state_dict().items())
        report = fresh.update_from_path(wrote.path)
        assert sorted(w["rank"] for w in report.workers) == [0, 1]
        ranks = fresh.llm.collective_rpc("tandem_param_info")
        qkv_bias = {r["rank"]: r["params"]["model.layers.0.self_attn.qkv_proj.bias"] for r in ranks}
        hidden, kv = other.config.hidden_size, other.config.num_key_value_heads * 64
        assert qkv_bias == {0: [hidden // 2 + 2 * kv], 1: [hidden // 2 + 2 * kv]}, "q split, kv replicated"
        assert greedy(fresh) == hf_greedy(other, tokenizer) != live
    finally:
        fresh.terminate()
    assert fresh.phase == Phase.STOPPED and fresh.llm is None


def test_update_forgets_prefixes_cached_with_the_old_weights(live_engine: RolloutEngine, live_publisher: Any) -> None:
    """A prompt longer than a KV block, generated before an update, is cached by vLLM's prefix caching; after
    the update its greedy answer must be the new weights' own (transformers'), not one computed on the old
    weights' KV of its first blocks."""
    cache = live_engine.llm.llm_engine.vllm_config.cache_config
    assert cache.enable_prefix_caching, "the engine runs with vLLM's prefix caching (its default)"
    ids = [(i * 13) % 900 + 2 for i in range(cache.block_size + 9)]  # one full block, then more
    greedy_long = SamplingOptions(temperature=0.0, max_tokens=8)
    live_publisher.publish(None, tiny_model.random_state_dict(41).items())
    live_engine.update()
    before = [live_engine.generate([ids], greedy_long)[0][0].token_ids for _ in range(2)]  # the 2nd hits the cache
    assert before[0] == before[1]
    new = tiny_model.random_model(seed=42)
    live_publisher.publish(None, new.state_dict().items())
    live_engine.update()
    after = live_engine.generate([ids], greedy_long)[0][0].token_ids
    with torch.no_grad():
        hf = new.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False, pad_token_id=1)[0, len(ids):]
    assert after == hf.tolist() != before[0]


def test_generate_samples_with_logprobs(live_engine: RolloutEngine) -> None:
    out = live_engine.generate([[5, 6, 7], "alpha"], SamplingOptions(temperature=1.0, max_tokens=6, seed=3), n=3)
    assert len(out) == 2 and all(len(samples) == 3 for samples in out)
    assert out[0][0].prompt_token_ids == [5, 6, 7]
    for c in (c for samples in out for c in samples):
        assert len(c.token_ids) == len(c.logprobs) == 6
        assert all(lp <= 0.0 for lp in c.logprobs)


def test_seeded_batch_over_the_step_token_budget(live_engine: RolloutEngine) -> None:
    """A seeded batch whose prefill must be chunked (more prompt tokens than one scheduler step takes)
    kills vLLM 0.32's CPU engine ("CPU Generator does not use offset") unless the engine drops
    per-request seeds on CPU; the engine must stay up and return every completion."""
    budget = live_engine.llm.llm_engine.vllm_config.scheduler_config.max_num_batched_tokens
    prompt_len = 200
    prompts = [[(i * 7 + j) % 900 + 2 for j in range(prompt_len)] for i in range(budget // prompt_len + 4)]
    out = live_engine.generate(prompts, SamplingOptions(temperature=1.0, max_tokens=4, seed=7, ignore_eos=True), n=2)
    assert len(out) == len(prompts) and all(len(g) == 2 and len(g[0].token_ids) == 4 for g in out)
    assert live_engine.phase == Phase.READY
    again = live_engine.generate(["alpha beta"], SamplingOptions(temperature=0.0, max_tokens=3))
    assert len(again[0][0].token_ids) == 3


def corrupt_one_byte(path: Path) -> None:
    idx = layout.read_index(path)
    rec = max(idx.tensors, key=lambda t: t.nbytes)
    with open(path / idx.shards[rec.shard].file, "r+b") as f:
        f.seek(rec.offset + rec.nbytes // 2)
        b = f.read(1)
        f.seek(rec.offset + rec.nbytes // 2)
        f.write(bytes([b[0] ^ 0x40]))


def test_corrupt_or_mismatched_versions_refused_engine_keeps_previous(
    live_engine: RolloutEngine, live_publisher: Any
) -> None:
    live_publisher.publish(None, tiny_model.random_state_dict(21).items())
    good = live_engine.update()
    expected = greedy(live_engine)

    rep = live_publisher.publish(None, tiny_model.random_state_dict(22).items())
    corrupt_one_byte(Path(rep.path))
    with pytest.raises(errors.ChecksumMismatch, match=f"version {rep.version}"):
        live_engine.update(rep.version)

    sd = tiny_model.random_state_dict(23)
    sd["model.norm.weight"] = torch.ones(7)
    rep_shape = live_publisher.publish(None, sd.items())
    with pytest.raises(errors.InvalidVersion, match="model.norm.weight: shape"):
        live_engine.update()

    sd = tiny_model.random_state_dict(24)
    del sd["model.layers.1.mlp.up_proj.weight"]
    live_publisher.publish(None, {k: v.double() if k == "lm_head.weight" else v for k, v in sd.items()}.items())
    with pytest.raises(errors.InvalidVersion, match="missing tensors.*up_proj.*lm_head.weight: dtype float64"):
        live_engine.update()

    with pytest.raises(errors.VersionNotFound):
        live_engine.update(rep_shape.version + 1000)
    assert live_engine.phase == Phase.READY and live_engine.version == good.version
    assert greedy(live_engine) == expected


def test_etcd_restart_around_an_update(live_engine: RolloutEngine, live_publisher: Any, etcd_server: Any) -> None:
    rep = live_publisher.publish(None, tiny_model.random_state_dict(31).items())
    previous = live_engine.version
    etcd_server.stop()
    try:  # etcd down before the update: it fails cleanly, nothing touched
        with pytest.raises(errors.RegistryUnavailable):
            live_engine.update()
        assert live_engine.phase == Phase.READY and live_engine.version == previous
        assert len(greedy(live_engine)) == 2
    finally:
        etcd_server.start()
    assert retry_update(live_engine).version == rep.version  # retried once etcd answers again

    # etcd stops in the middle of an update (after the pin, while vLLM reloads): the reload
    # completes, the unpin is retried at the next update
    rep2 = live_publisher.publish(None, tiny_model.random_state_dict(32).items())
    stopper = threading.Thread(target=lambda: (_wait_phase(live_engine, Phase.UPDATING), etcd_server.stop()))
    stopper.start()
    try:
        report = live_engine.update()
        stopper.join(30)
    finally:
        etcd_server.start()
    assert report.version == rep2.version and live_engine.phase == Phase.READY
    retry_update(live_engine)  # works again, releases the stale pin
    assert live_publisher.registry.readers(rep2.version) == []


def retry_update(engine: RolloutEngine, timeout: float = 20) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return engine.update()
        except errors.RegistryUnavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _wait_phase(engine: RolloutEngine, phase: Phase, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while engine.phase != phase and time.monotonic() < deadline:
        time.sleep(0.001)
