"""`tandem validate` and `tandem crd` as a user runs them: exit codes and messages naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tandem.cli.main import CRD_TARGETS, app

ROOT = Path(__file__).parents[2]
runner = CliRunner()


def _job(**spec: object) -> dict[str, object]:
    base: dict[str, object] = {"model": {"path": "/models/m"}, "dataset": {"path": "/data/p.jsonl"},
                               "rewards": [{"type": "answerMatch"}]}
    base.update(spec)
    return {"apiVersion": "tandem.dev/v1alpha1", "kind": "RLHFJob", "metadata": {"name": "j"}, "spec": base}


def _write(tmp_path: Path, doc: object, name: str = "job.yaml") -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(doc))
    return p


@pytest.mark.parametrize("sample", sorted((ROOT / "manifests" / "samples").glob("*.yaml")) + [
    ROOT / "examples" / "tiny-grpo.yaml"], ids=lambda p: p.name)
def test_shipped_samples_are_valid(sample: Path) -> None:
    result = runner.invoke(app, ["validate", str(sample)])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize(("spec", "field", "words"), [
    ({"gpusPerPod": 8, "trainer": {"tensorParallel": 3}}, "spec.trainer.tensorParallel", "divide"),
    ({"rewards": [{"type": "format"}]}, "spec.rewards.0.pattern", "pattern"),
    ({"rewards": [{"type": "format", "pattern": "("}]}, "spec.rewards.0.pattern", "regular expression"),
    ({"algorithm": {"name": "a2c"}}, "spec.algorithm.name", "grpo"),
    ({"rollout": {"temperature": -1}}, "spec.rollout.temperature", "greater"),
    ({"checkpointEngine": {"shmSize": "lots"}}, "spec.checkpointEngine.shmSize", "pattern"),
    ({"replicas": 0}, "spec.replicas", "greater"),
    ({"trainer": {"globalBatchSize": 10, "microBatchSize": 4}}, "spec.trainer.globalBatchSize", "multiple"),
    ({"bogus": 1}, "spec.bogus", "unknown field"),
])
def test_invalid_spec_names_the_field(tmp_path: Path, spec: dict[str, object], field: str, words: str) -> None:
    result = runner.invoke(app, ["validate", str(_write(tmp_path, _job(**spec)))])
    assert result.exit_code == 1
    line = next((ln for ln in result.output.splitlines() if field in ln), None)
    assert line is not None, result.output
    assert words in line, line


def test_missing_required_and_bad_files(tmp_path: Path) -> None:
    doc = _job()
    del doc["spec"]["dataset"]  # type: ignore[attr-defined]
    result = runner.invoke(app, ["validate", str(_write(tmp_path, doc))])
    assert result.exit_code == 1 and "spec.dataset" in result.output and "missing" in result.output
    result = runner.invoke(app, ["validate", str(tmp_path / "nope.yaml")])
    assert result.exit_code == 1 and "nope.yaml" in result.output
    (tmp_path / "bad.yaml").write_text("spec: [unclosed\n")
    result = runner.invoke(app, ["validate", str(tmp_path / "bad.yaml")])
    assert result.exit_code == 1 and "<yaml>" in result.output
    two = tmp_path / "two.yaml"
    two.write_text(yaml.safe_dump(_job()) + "---\n" + yaml.safe_dump(_job()))
    result = runner.invoke(app, ["validate", str(two)])
    assert result.exit_code == 1 and "exactly one document" in result.output


def test_crd_output_is_the_committed_crd() -> None:
    result = runner.invoke(app, ["crd"])
    assert result.exit_code == 0
    for target in CRD_TARGETS:
        assert (ROOT / target).read_text() == result.output, f"{target} is stale: run `tandem crd --write`"


def test_run_rejects_an_invalid_job_before_starting_anything(tmp_path: Path) -> None:
    result = runner.invoke(app, ["run", str(_write(tmp_path, _job(replicas=-1))), "--workdir", str(tmp_path / "r")])
    assert result.exit_code == 2 and "spec.replicas" in result.output
    assert not (tmp_path / "r").exists()
