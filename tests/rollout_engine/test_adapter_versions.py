"""Adapter-only versions (trainer.lora.sync adapter) through the real checkpoint engine and a real vLLM.

A vLLM engine started with LoRA enabled (the base model's own weights) serves each published version of
PEFT adapters hot, without a restart: greedy tokens and log-probs equal transformers with PEFT on the same
adapters, version after version, and the previous adapter is dropped. Bad adapter versions (wrong rank, half
a pair, a module the base lacks, a damaged shard) are refused before vLLM sees them and the engine keeps
serving the previous adapter; a whole version on such an engine serves the whole model; an engine that
serves whole versions refuses an adapter version. Export turns an adapter version into the merged model
and a PEFT adapter directory that PEFT loads. Adapter names and config are the trainer's own
(`tandem.sidecars.trainer.engines.lora`), checked against PEFT's `get_peft_model_state_dict`.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tiny_model
import torch

from tandem.checkpoint_engine import errors
from tandem.checkpoint_engine.versions import adapters, layout, version_writer
from tandem.sidecars.rollout_engine.sampling import SamplingOptions
from tandem.sidecars.trainer.engines import lora

PROMPTS = [[5, 17, 33, 2, 9], [40, 41, 42], [7] * 6]
RANK = 8


def peft_model(base_dir: Path, seed: int, rank: int = RANK) -> tuple[Any, dict[str, torch.Tensor], dict[str, Any]]:
    """A PeftModel on the tiny model with random adapters: (model, adapters by saved name, PEFT config)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base_dir),
                           LoraConfig(r=rank, lora_alpha=2 * rank, target_modules="all-linear"))
    state = tiny_model.random_adapters(model, seed)
    return model, state, lora.config_dict(model, base_dir)


def check_greedy(engine: Any, model: Any) -> None:
    """Every greedy token of the engine is the argmax of `model`'s logits, with its log-prob."""
    outs = engine.generate(PROMPTS, SamplingOptions(temperature=0.0, max_tokens=10, ignore_eos=True))
    for prompt, (c,) in zip(PROMPTS, outs, strict=True):
        ids = torch.tensor([prompt + c.token_ids])
        with torch.no_grad():
            logp = torch.log_softmax(model(ids).logits[0].float(), -1)[len(prompt) - 1:-1]
        assert logp.argmax(-1).tolist() == c.token_ids
        ref = logp.gather(1, torch.tensor(c.token_ids)[:, None]).squeeze(1)
        assert torch.allclose(ref, torch.tensor(c.logprobs), atol=1e-3), (ref, c.logprobs)


@pytest.fixture(scope="module")
def lora_engine(etcd_server: Any, tiny_dir: Path) -> Iterator[tuple[Any, Any, Path]]:
    """A vLLM engine with LoRA enabled (rank 8) and a publisher on the same job and shm root."""
    import shutil

    from tandem.checkpoint_engine.etcd.sync_registry import SyncRegistry
    from tandem.checkpoint_engine.service.publisher import Publisher
    from tandem.sidecars.rollout_engine.engine import EngineConfig, RolloutEngine

    root = Path("/dev/shm") / f"tandem-lora-{uuid.uuid4().hex[:8]}"
    root.mkdir()
    job = "lora"
    reader = SyncRegistry(etcd_server.endpoint, "test", job, "pod0", "rollout", ttl=5, timeout=2.0).connect()
    writer = SyncRegistry(etcd_server.endpoint, "test", job, "pod0", "trainer", ttl=5, timeout=2.0).connect()
    engine = RolloutEngine(EngineConfig(shm_root=root, job=job, max_model_len=256, lora_rank=RANK), registry=reader)
    engine.start(str(tiny_dir), dummy=True)  # dummy is ignored: adapters apply to the base's own weights
    publisher = Publisher(root, job, writer, keep=2)
    yield engine, publisher, root
    engine.terminate()
    publisher.close()
    reader.close()
    shutil.rmtree(root, ignore_errors=True)


def test_saved_names_and_config_are_pefts(tiny_dir: Path) -> None:
    from peft import get_peft_model_state_dict

    model, state, config = peft_model(tiny_dir, seed=1)
    theirs = get_peft_model_state_dict(model)
    assert set(state) == set(theirs) and all(torch.equal(state[k], theirs[k]) for k in state)
    assert config["r"] == RANK and config["lora_alpha"] == 2 * RANK and config["peft_type"] == "LORA"
    assert isinstance(config["target_modules"], list)
    assert any(m.endswith("q_proj") for m in config["target_modules"])
    assert {lora.param_name(k) for k in state} == {n for n, _ in model.named_parameters() if lora.is_adapter(n)}


def test_adapter_versions_are_served_hot_version_after_version(lora_engine: tuple[Any, Any, Path],
                                                               tiny_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    engine, publisher, root = lora_engine
    assert engine.dummy is False and engine.lora is None
    check_greedy(engine, AutoModelForCausalLM.from_pretrained(tiny_dir).eval())  # the base, loaded at start
    for seed in (1, 2):
        model, state, config = peft_model(tiny_dir, seed)
        report = publisher.publish(None, state.items(), adapter=config)
        whole = sum(p.numel() * 4 for p in model.get_base_model().parameters())
        assert report.bytes < whole / 10  # adapters only
        update = engine.update(report.version)
        assert engine.lora is not None and engine.lora.lora_int_id == report.version
        assert update.bytes == report.bytes and engine.version == report.version
        check_greedy(engine, model)
        served = sorted(p.name for p in (layout.job_dir(root, "lora") / ".lora").iterdir())
        assert served == [f"v{report.version:012d}"]  # the previous adapter is gone
    record = publisher.registry.version_record(report.version)
    assert record["adapter"] is True


def _write(root: Path, version: int, tensors: dict[str, torch.Tensor], config: dict[str, Any]) -> Path:
    return version_writer.write_version(root, "bad", version, tensors.items(), adapter=config).path


def test_bad_adapter_versions_are_refused_and_the_served_adapter_stays(lora_engine: tuple[Any, Any, Path],
                                                                       tiny_dir: Path, tmp_path: Path) -> None:
    engine, publisher, _ = lora_engine
    model, state, config = peft_model(tiny_dir, seed=3)
    engine.update(publisher.publish(None, state.items(), adapter=config).version)
    served = engine.version
    a_name = next(k for k in state if ".lora_A." in k)
    wrong_rank = {k: (v[:4] if ".lora_A." in k else v[:, :4]) for k, v in state.items()}
    half = {k: v for k, v in state.items() if k != a_name}
    foreign = dict(state) | {"base_model.model.model.layers.9.mlp.up_proj.lora_A.weight": state[a_name],
                             "base_model.model.model.layers.9.mlp.up_proj.lora_B.weight":
                                 state[a_name.replace("lora_A", "lora_B")]}
    cases = [(wrong_rank, "shape"), (half, "A/B pair"), (foreign, "no linear layer")]
    for i, (tensors, words) in enumerate(cases, start=1):
        with pytest.raises(errors.InvalidVersion, match=words):
            engine.update_from_path(_write(tmp_path, i, tensors, config))
    damaged = _write(tmp_path, 9, state, config)
    shard = sorted(damaged.glob("shard-*.bin"))[0]
    raw = bytearray(shard.read_bytes())
    raw[100] ^= 0xFF
    shard.write_bytes(bytes(raw))
    with pytest.raises(errors.ChecksumMismatch):
        engine.update_from_path(damaged)
    assert engine.version == served and engine.phase.value == "ready"
    check_greedy(engine, model)


def test_a_whole_version_on_a_lora_engine_serves_the_whole_model(lora_engine: tuple[Any, Any, Path]) -> None:
    import tiny_model

    engine, publisher, _ = lora_engine
    other = tiny_model.random_model(seed=5)
    engine.update(publisher.publish(None, tiny_model.random_state_dict(5).items()).version)
    assert engine.lora is None
    check_greedy(engine, other)


def test_an_engine_of_whole_versions_refuses_adapters(live_engine: Any, tiny_dir: Path, tmp_path: Path) -> None:
    _, state, config = peft_model(tiny_dir, seed=4)
    before = live_engine.version
    with pytest.raises(errors.InvalidVersion, match="LoRA adapters only"):
        live_engine.update_from_path(_write(tmp_path, 1, state, config))
    assert live_engine.version == before


def test_export_of_an_adapter_version_is_the_merged_model_and_a_peft_adapter(tiny_dir: Path, tmp_path: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from tandem.checkpoint_engine.versions.hf_export import export_version

    model, state, config = peft_model(tiny_dir, seed=6)
    version = _write(tmp_path / "shm", 1, state, config)
    out = export_version(version, tiny_dir, tmp_path / "export")
    ids = torch.tensor([PROMPTS[0]])
    with torch.no_grad():
        want = model(ids).logits
        merged = AutoModelForCausalLM.from_pretrained(out)(ids).logits
        loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_dir), out / "adapter").eval()
        again = loaded(ids).logits
    assert torch.allclose(merged, want, atol=1e-4) and torch.allclose(again, want, atol=1e-5)
    ours = dict(adapters.merged(adapters.base_weights(tiny_dir), state, config))
    theirs = model.merge_and_unload().state_dict()
    assert all(torch.allclose(ours[k], theirs[k], atol=1e-6) for k in ours)
