"""Unusable model directories named up front (`tandem.spec.model_dir`): each way config.json or the
tokenizer can be missing or broken gives one line naming the file and the spec field; `tandem validate`
checks the directories that exist here (a cluster's exist only in its pods), `tandem run` all of them,
before anything starts. Also the context length the rollout's vLLM gets from the spec and config.json."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tandem.cli.main import app
from tandem.spec import model_dir
from tandem.spec.rollout import Rollout

runner = CliRunner()


def good_dir(root: Path, name: str = "m") -> Path:
    d = root / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "qwen2", "max_position_embeddings": 2048}))
    (d / "tokenizer.json").write_text("{}")
    return d


def _no_config(d: Path) -> None:
    (d / "config.json").unlink()


def _config_dir(d: Path) -> None:
    (d / "config.json").unlink()
    (d / "config.json").mkdir()


BROKEN: list[tuple[str, Callable[[Path], object], str]] = [
    ("no-config", _no_config, "config.json is missing"),
    ("config-unreadable", _config_dir, "cannot read"),
    ("config-not-json", lambda d: (d / "config.json").write_text('{"model_type": "qwen2",'), "not valid JSON"),
    ("config-not-object", lambda d: (d / "config.json").write_text("[1, 2]"), "not a JSON object"),
    ("config-not-utf8", lambda d: (d / "config.json").write_bytes(b"\xff\xfe{}"), "not UTF-8"),
    ("no-tokenizer", lambda d: (d / "tokenizer.json").unlink(), "no tokenizer files"),
]


@pytest.mark.parametrize(("case", "breaks", "words"), BROKEN, ids=[c[0] for c in BROKEN])
def test_each_broken_dir_is_one_line_naming_file_and_field(
    tmp_path: Path, case: str, breaks: Callable[[Path], object], words: str
) -> None:
    d = good_dir(tmp_path)
    assert model_dir.check(d, "spec.model.path", tokenizer=True)["max_position_embeddings"] == 2048
    breaks(d)
    with pytest.raises(model_dir.ModelDirError) as err:
        model_dir.check(d, "spec.model.path", tokenizer=True)
    text = str(err.value)
    assert text.startswith("spec.model.path: ") and str(d) in text and words in text and "\n" not in text


def test_a_missing_path_or_a_file() -> None:
    with pytest.raises(model_dir.ModelDirError, match="spec.reference.path: /nonexistent/m does not exist"):
        model_dir.read_config("/nonexistent/m", "spec.reference.path")
    with pytest.raises(model_dir.ModelDirError, match="is not a directory"):
        model_dir.read_config(__file__, "spec.model.path")


def test_context_length_from_the_spec_and_the_config() -> None:
    assert model_dir.context_length(Rollout(max_tokens=512), {"max_position_embeddings": 4096}) == 1536
    assert model_dir.context_length(Rollout(max_tokens=4000), {"max_position_embeddings": 4096}) == 4096
    assert model_dir.context_length(Rollout(max_tokens=8000), {}) == model_dir.DEFAULT_POSITIONS
    explicit = Rollout(max_tokens=512, max_model_len=700)
    assert model_dir.context_length(explicit, {"max_position_embeddings": 4096}) == 700
    assert "maxTokens 512 + 1024" in model_dir.context_fields(Rollout(max_tokens=512))
    assert model_dir.context_fields(Rollout(max_model_len=700)) == "spec.rollout.maxModelLen"


def flat(text: str) -> str:
    """`text` without whitespace: the console wraps long lines anywhere, even inside a path."""
    return "".join(text.split())


def job_file(root: Path, model: str, reference: str | None = None) -> Path:
    spec: dict[str, object] = {"model": {"path": model}, "dataset": {"path": "p.jsonl"}, "gpusPerPod": 0,
                               "rewards": [{"type": "answerMatch"}]}
    if reference is not None:
        spec["reference"] = {"path": reference}
    f = root / "job.yaml"
    f.write_text(yaml.safe_dump({"apiVersion": "tandem.dev/v1alpha1", "kind": "RLHFJob",
                                 "metadata": {"name": "j"}, "spec": spec}))
    return f


def test_validate_checks_the_dirs_that_exist_here(tmp_path: Path) -> None:
    d = good_dir(tmp_path)
    assert runner.invoke(app, ["validate", str(job_file(tmp_path, str(d)))]).exit_code == 0
    cluster_only = runner.invoke(app, ["validate", str(job_file(tmp_path, "/models/only-in-the-pods"))])
    assert cluster_only.exit_code == 0, cluster_only.output
    ref = good_dir(tmp_path, "ref")
    (ref / "config.json").unlink()
    result = runner.invoke(app, ["validate", str(job_file(tmp_path, "m", reference="ref"))])  # relative paths
    assert result.exit_code == 1 and flat(f"spec.reference.path: {ref}/config.json is missing") in flat(result.output)
    (d / "tokenizer.json").unlink()
    result = runner.invoke(app, ["validate", str(job_file(tmp_path, str(d)))])
    assert result.exit_code == 1 and flat(f"spec.model.path: {d} has no tokenizer files") in flat(result.output)


@pytest.mark.parametrize("model", ["broken", "/nonexistent/model"])
def test_run_refuses_before_starting_anything(tmp_path: Path, model: str) -> None:
    d = good_dir(tmp_path, "broken")
    (d / "config.json").unlink()
    result = runner.invoke(app, ["run", str(job_file(tmp_path, model)), "--workdir", str(tmp_path / "runs")])
    want = f"{d}/config.json is missing" if model == "broken" else f"{model} does not exist"
    assert result.exit_code == 2 and flat(f"spec.model.path: {want}") in flat(result.output)
    assert not (tmp_path / "runs").exists()
