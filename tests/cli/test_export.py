"""`tandem export` as a user runs it on checkpointEngine.persist's store: newest or chosen version,
loadable output, and a damaged copy refused with exit 1 and the file named; `tandem validate` on the
spec.export and spec.tracking fields (the export path must lie on a writable volume)."""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parents[1] / "trainer"))
from hf_source import logits, make_source, publish  # noqa: E402

from tandem.checkpoint_engine.versions import layout  # noqa: E402
from tandem.checkpoint_engine.versions.durable import DurableStore  # noqa: E402
from tandem.cli.main import app  # noqa: E402

runner = CliRunner()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[tuple[Path, Path, DurableStore]]:
    """A model directory and a durable store under <tmp>/ckpt with versions 1 and 2 of different weights."""
    import shutil

    shm = Path("/dev/shm") / f"tandem-cli-export-{uuid.uuid4().hex[:8]}"
    model = make_source(tmp_path / "model", tied=True)
    other = make_source(tmp_path / "other", tied=True, seed=1)
    durable = DurableStore(tmp_path / "ckpt", "default", "tiny-grpo", "0b7c-uid", keep=2)
    try:
        for v, weights in ((1, model), (2, other)):
            durable.save(publish(shm, weights, v), v, iteration=v * 10)
        yield model, other, durable
    finally:
        shutil.rmtree(shm, ignore_errors=True)


def test_export_newest_and_chosen_version(store: tuple[Path, Path, DurableStore], tmp_path: Path) -> None:
    model, other, durable = store
    result = runner.invoke(app, ["export", str(tmp_path / "ckpt"), str(tmp_path / "hf-newest"), "--model", str(model)])
    assert result.exit_code == 0, result.output
    assert "v000000000002" in result.output and str(tmp_path / "hf-newest") in result.output
    assert torch.equal(logits(tmp_path / "hf-newest"), logits(other))

    result = runner.invoke(app, ["export", str(durable.directory), str(tmp_path / "hf-1"), "--model", str(model),
                                 "--version", "1", "--dtype", "bfloat16", "--max-shard-size", "100KB"])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "hf-1" / "config.json").read_text())["dtype"] == "bfloat16"
    assert (tmp_path / "hf-1" / "model.safetensors.index.json").is_file()
    assert torch.equal(logits(tmp_path / "hf-1", dtype="auto"), logits(model, dtype=torch.bfloat16))

    version_dir = durable.directory / "v000000000001"  # a version directory given directly
    result = runner.invoke(app, ["export", str(version_dir), str(tmp_path / "hf-v1"), "--model", str(model)])
    assert result.exit_code == 0, result.output
    assert torch.equal(logits(tmp_path / "hf-v1"), logits(model))


def test_export_errors_exit_nonzero_naming_the_problem(store: tuple[Path, Path, DurableStore], tmp_path: Path) -> None:
    model, _, durable = store
    ckpt = str(tmp_path / "ckpt")
    result = runner.invoke(app, ["export", ckpt, str(tmp_path / "x"), "--model", str(model), "--version", "7"])
    assert result.exit_code == 1 and "no complete version 7" in result.output

    result = runner.invoke(app, ["export", ckpt, str(tmp_path / "x"), "--model", str(model), "--dtype", "int8"])
    assert result.exit_code == 2 and "--dtype" in result.output

    newest = durable.directory / "v000000000002"
    index = layout.read_index(newest)
    shard = newest / index.shards[-1].file
    data = bytearray(shard.read_bytes())
    data[index.tensors[-1].offset] ^= 0x01
    shard.write_bytes(bytes(data))
    result = runner.invoke(app, ["export", ckpt, str(tmp_path / "x"), "--model", str(model)])
    assert result.exit_code == 1
    assert shard.name in result.output and "damaged" in result.output
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(("spec", "field"), [
    ({"export": {"path": "/elsewhere/hf"}}, "spec.export.path"),  # on no volume
    ({"export": {"path": "/ro/hf"}, "volumes": [{"name": "ro", "mountPath": "/ro", "claimName": "p",
                                                 "readOnly": True}]}, "spec.export.path"),
    ({"export": {"path": "relative/hf"}}, "spec.export.path"),
    ({"export": {"path": "/ckpt/hf", "every": 0}}, "spec.export.every"),
    ({"export": {"path": "/ckpt/hf", "dtype": "int8"}}, "spec.export.dtype"),
    ({"tracking": {"mlflow": {"trackingUri": "mlflow:5000"}}}, "spec.tracking.mlflow.trackingUri"),
    ({}, None),
    ({"export": {"path": "/ckpt/hf/run-1", "every": 5, "dtype": "bfloat16"},
      "tracking": {"tensorboard": False, "mlflow": {"trackingUri": "file:///ckpt/mlruns", "runName": "r"}}}, None),
])
def test_validate_export_and_tracking_fields(tmp_path: Path, spec: dict[str, object], field: str | None) -> None:
    import yaml

    base: dict[str, object] = {"model": {"path": "/models/m"}, "dataset": {"path": "/data/p.jsonl"},
                               "rewards": [{"type": "answerMatch"}],
                               "volumes": [{"name": "ckpt", "mountPath": "/ckpt", "claimName": "pvc"}]}
    doc = {"apiVersion": "tandem.dev/v1alpha1", "kind": "RLHFJob", "metadata": {"name": "j"}, "spec": {**base, **spec}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(doc))
    result = runner.invoke(app, ["validate", str(tmp_path / "job.yaml")])
    if field is None:
        assert result.exit_code == 0, result.output
    else:
        assert result.exit_code == 1 and field in result.output, result.output
