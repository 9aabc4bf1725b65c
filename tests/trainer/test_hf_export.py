"""HF export: a published version becomes a directory transformers loads as-is, with the same logits as the
source model (tied and untied), its tokenizer and chat template; damaged or incomplete input is refused."""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from hf_source import CHAT_TEMPLATE, MESSAGES, hf_state, logits, make_source, publish  # noqa: E402

from tandem.checkpoint_engine import errors  # noqa: E402
from tandem.checkpoint_engine.versions import layout  # noqa: E402
from tandem.checkpoint_engine.versions.durable import DurableStore  # noqa: E402
from tandem.checkpoint_engine.versions.hf_export import (  # noqa: E402
    STALE_S,
    ExportError,
    export_hf_dir,
    export_version,
    resolve_source,
)


@pytest.fixture(scope="module", params=[True, False], ids=["tied", "untied"])
def source(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_source(tmp_path_factory.mktemp("src") / "model", tied=request.param)


@pytest.fixture
def shm_root() -> Iterator[Path]:
    import shutil

    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path("/tmp")
    root = base / f"tandem-export-{uuid.uuid4().hex[:8]}"
    root.mkdir()
    yield root
    shutil.rmtree(root, ignore_errors=True)


def leftovers(directory: Path) -> list[str]:
    return [p.name for p in directory.iterdir() if p.name.startswith(".")]


def test_exported_version_loads_with_the_source_logits_and_chat_template(
    source: Path, shm_root: Path, tmp_path: Path
) -> None:
    from safetensors import safe_open
    from transformers import AutoTokenizer

    version = publish(shm_root, source, 7)
    assert len(layout.read_index(version).shards) > 1
    out = export_version(version, source, tmp_path / "iteration-7")
    assert out == tmp_path / "iteration-7"

    src_config = json.loads((source / "config.json").read_text())
    config = json.loads((out / "config.json").read_text())
    assert config["dtype"] == "float32"
    assert config["tie_word_embeddings"] is src_config["tie_word_embeddings"]
    assert {k: v for k, v in config.items() if k != "dtype"} == {k: v for k, v in src_config.items() if k != "dtype"}
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        assert f.metadata() == {"format": "pt"}
    assert ("lm_head.weight" in names) is not src_config["tie_word_embeddings"]
    assert names == set(hf_state(source))
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        assert (out / name).read_bytes() == (source / name).read_bytes(), name
    assert json.loads((out / "generation_config.json").read_text())["temperature"] == 0.7

    assert torch.equal(logits(out), logits(source))
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.chat_template == CHAT_TEMPLATE
    text = tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert text == "<|system|>alpha beta<|endoftext|><|user|>gamma 12 delta<|endoftext|><|assistant|>"
    assert leftovers(tmp_path) == []


def test_sharded_bfloat16_export_and_replacing_an_earlier_one(source: Path, shm_root: Path, tmp_path: Path) -> None:
    target = tmp_path / "iteration-3"
    first = export_version(publish(shm_root, source, 3), source, target)
    marker = first / "model.safetensors"
    assert marker.exists()
    out = export_version(layout.version_dir(shm_root, "job", 3), source, target, dtype=torch.bfloat16,
                         max_shard_size=100_000)  # the same iteration again: replaced whole
    assert out == target and not marker.exists()
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 1 and all((out / f).is_file() for f in files)
    assert set(index["weight_map"]) == set(hf_state(source))
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    got = logits(out, dtype="auto")  # the config's dtype
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, logits(source, dtype=torch.bfloat16))
    assert leftovers(tmp_path) == []


def test_an_interrupted_exports_leftovers_are_removed_once_stale(source: Path, tmp_path: Path) -> None:
    import os

    dead, fresh = tmp_path / ".iteration-9.tmp-0123456789ab", tmp_path / ".iteration-9.tmp-live00000000"
    other = tmp_path / ".iteration-10.tmp-0123456789ab"  # another target's: not ours to judge
    for d in (dead, fresh, other):
        (d / "sub").mkdir(parents=True)
    old = time.time() - STALE_S - 60
    for d in (dead, other):
        os.utime(d, (old, old))
    export_hf_dir(hf_state(source).items(), source, tmp_path / "iteration-9")
    assert not dead.exists() and fresh.exists() and other.exists()


def test_a_tied_head_given_anyway_is_not_written(tmp_path: Path, shm_root: Path) -> None:
    from safetensors import safe_open

    source = make_source(tmp_path / "src", tied=True)
    out = export_version(publish(shm_root, source, 1, with_tied_head=True), source, tmp_path / "out")
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert "lm_head.weight" not in f.keys()
    assert torch.equal(logits(out), logits(source))
    state = hf_state(source)
    state["lm_head.weight"] = torch.zeros_like(state["model.embed_tokens.weight"])
    with pytest.raises(ExportError, match="lm_head.weight differs"):
        export_hf_dir(state.items(), source, tmp_path / "bad")
    assert not (tmp_path / "bad").exists()


def test_a_corrupt_shard_is_refused_naming_the_file(source: Path, shm_root: Path, tmp_path: Path) -> None:
    version = publish(shm_root, source, 5)
    export_version(version, source, tmp_path / "iteration-5")
    index = layout.read_index(version)
    rec = next(t for t in index.tensors if t.shard == 1)
    shard = version / index.shards[1].file
    with open(shard, "r+b") as f:
        f.seek(rec.offset + 3)
        byte = f.read(1)
        f.seek(rec.offset + 3)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(errors.ChecksumMismatch, match=str(shard)):
        export_version(version, source, tmp_path / "iteration-5")
    assert torch.equal(logits(tmp_path / "iteration-5"), logits(source))  # the earlier export stands
    shard.write_bytes(shard.read_bytes()[:-8])
    with pytest.raises(errors.TornVersion, match=str(shard)):
        export_version(version, source, tmp_path / "other")
    assert not (tmp_path / "other").exists() and leftovers(tmp_path) == []


def test_missing_or_misshapen_tensors_are_refused_before_writing(source: Path, tmp_path: Path) -> None:
    state = hf_state(source)
    del state["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(ExportError, match=r"missing tensors \['model.layers.1.mlp.up_proj.weight'\]"):
        export_hf_dir(state.items(), source, tmp_path / "out")
    state = hf_state(source)
    state["model.norm.weight"] = torch.ones(3)
    state["extra.weight"] = torch.ones(3)
    with pytest.raises(ExportError, match=r"unexpected tensors \['extra.weight'\].*model.norm.weight: \(3,\)"):
        export_hf_dir(state.items(), source, tmp_path / "out")
    with pytest.raises(ExportError, match="has no config.json"):
        export_hf_dir(hf_state(source).items(), tmp_path, tmp_path / "out")
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []


def test_resolve_source_finds_the_newest_durable_copy(tmp_path: Path, shm_root: Path) -> None:
    source = make_source(tmp_path / "src", tied=False)
    store = DurableStore(tmp_path / "ckpt", "ns", "job", "uid-1", keep=3)
    for v in (2, 4):
        store.save(publish(shm_root, source, v), v, iteration=v * 10)
    store.write_train_file(9, "rank-00000.pt", lambda p: p.write_bytes(b"x"))  # train/v9 is not a weight copy
    newest = store.directory / "v000000000004"
    for given in (tmp_path / "ckpt", tmp_path / "ckpt" / "ns", store.directory):
        assert resolve_source(given) == newest
    assert resolve_source(tmp_path / "ckpt", 2) == store.directory / "v000000000002"
    assert resolve_source(newest) == newest
    with pytest.raises(ExportError, match=r"no complete version 3 \(complete: \[2, 4\]\)"):
        resolve_source(tmp_path / "ckpt", 3)
    with pytest.raises(ExportError, match="holds version 4, not 2"):
        resolve_source(newest, 2)
    DurableStore(tmp_path / "ckpt", "ns", "job", "uid-2").save(newest, 4, iteration=40)
    with pytest.raises(ExportError, match="copies of 2 jobs"):
        resolve_source(tmp_path / "ckpt")
    with pytest.raises(ExportError, match="neither a version directory"):
        resolve_source(tmp_path / "src")


@pytest.mark.vllm
def test_vllm_loads_the_export_as_is(tmp_path: Path, shm_root: Path) -> None:
    """What `vllm serve DIR` does: real weights from the directory, its tokenizer and chat template;
    greedy tokens equal the source model's under transformers."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tandem.sidecars.rollout_engine.engine import EngineConfig, RolloutEngine
    from tandem.sidecars.rollout_engine.sampling import SamplingOptions

    source = make_source(tmp_path / "src", tied=True, seed=3, hidden=128, heads=2, kv_heads=1)  # CPU: head_dim 64
    out = export_version(publish(shm_root, source, 1), source, tmp_path / "iteration-1")
    tok = AutoTokenizer.from_pretrained(source)
    prompt = tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    ids = tok(prompt, return_tensors="pt").input_ids
    model = AutoModelForCausalLM.from_pretrained(source).eval()
    expected: list[int] = []
    with torch.no_grad():  # greedy by full forwards: the plain reference, no generation config involved
        for _ in range(8):
            expected.append(int(model(torch.tensor([ids[0].tolist() + expected])).logits[0, -1].argmax()))

    engine = RolloutEngine(EngineConfig(shm_root=shm_root, job="serve", max_model_len=256))
    engine.start(str(out), dummy=False)
    try:
        assert engine.llm.get_tokenizer().apply_chat_template(MESSAGES, tokenize=False,
                                                              add_generation_prompt=True) == prompt
        got = engine.generate([ids[0].tolist()], SamplingOptions(temperature=0.0, max_tokens=8, ignore_eos=True))
        assert got[0][0].token_ids == expected
    finally:
        engine.terminate()
