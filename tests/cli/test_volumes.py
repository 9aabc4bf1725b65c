"""`tandem run`'s hostPath volumes: job paths under a mountPath are rewritten to the host directory."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tandem.cli.main import app
from tandem.cli.volumes import localize
from tandem.spec.load import SpecError, parse_job


def _job(volumes: list[dict[str, object]], **spec: object) -> dict[str, object]:
    base: dict[str, object] = {
        "model": {"path": "/models/qwen"}, "dataset": {"path": "/data/deep/p.jsonl"},
        "reference": {"path": "/models/ref"},
        "rewards": [{"type": "model", "path": "/models/rm"}, {"type": "answerMatch"}],
        "volumes": volumes,
    }
    base.update(spec)
    return {"apiVersion": "tandem.dev/v1alpha1", "kind": "RLHFJob", "metadata": {"name": "j"}, "spec": base}


def test_paths_under_host_path_mounts_are_rewritten_and_rules_still_hold() -> None:
    doc = _job([{"name": "models", "mountPath": "/models", "hostPath": "/srv/m"},
                {"name": "data", "mountPath": "/data", "hostPath": "/srv/d"},
                {"name": "deep", "mountPath": "/data/deep", "hostPath": "/fast/deep"},
                {"name": "ckpt", "mountPath": "/ckpt", "hostPath": "/srv/ckpt"}],
               checkpointEngine={"persist": {"path": "/ckpt/run", "every": 3}})
    job = parse_job(doc)
    out = localize(job).spec
    assert out.model.path == "/srv/m/qwen" and out.reference.path == "/srv/m/ref"
    assert out.dataset.path == "/fast/deep/p.jsonl"  # the deepest mount wins, as in a container
    assert out.rewards[0].path == "/srv/m/rm" and out.rewards[1].path is None
    assert out.checkpoint_engine.persist is not None and out.checkpoint_engine.persist.path == "/srv/ckpt/run"
    assert job.spec.model.path == "/models/qwen"  # the caller's job is left alone
    # what the sidecars load (job.yaml) passes the same rules: persist.path lies on a (rewritten) volume
    parse_job(yaml.safe_load(yaml.safe_dump({**doc, "spec": out.model_dump(mode="json", by_alias=True,
                                                                           exclude_none=True)})))


def test_paths_outside_volumes_and_lookalike_prefixes_stay() -> None:
    job = parse_job(_job([{"name": "m", "mountPath": "/mod", "hostPath": "/srv/m"}]))
    out = localize(job).spec
    assert out.model.path == "/models/qwen"  # /models is not under /mod


def test_a_claim_is_refused_naming_the_field(tmp_path: Path) -> None:
    doc = _job([{"name": "a", "mountPath": "/a", "hostPath": "/srv/a"},
                {"name": "ckpt", "mountPath": "/ckpt", "claimName": "checkpoints"}])
    with pytest.raises(SpecError) as e:
        localize(parse_job(doc), "job.yaml")
    assert e.value.fields == ["spec.volumes[1].claimName"]
    f = tmp_path / "job.yaml"
    f.write_text(yaml.safe_dump(doc))
    result = CliRunner().invoke(app, ["run", str(f), "--workdir", str(tmp_path / "runs")])
    assert result.exit_code == 2
    assert "spec.volumes[1].claimName" in result.output and "hostPath" in result.output
    assert not (tmp_path / "runs").exists()  # refused before anything started
