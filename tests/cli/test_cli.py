"""`tandem validate` and `tandem crd` as a user runs them: exit codes and messages naming the field."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tandem.cli import say
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
    ROOT / "examples" / name
    for name in ("tiny-grpo.yaml", "tiny-moe-grpo.yaml", "vlm-grpo.yaml", "vlm-look-again.yaml")],
    ids=lambda p: p.name)
def test_shipped_samples_are_valid(sample: Path) -> None:
    result = runner.invoke(app, ["validate", str(sample)])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize(("spec", "field", "words"), [
    ({"gpusPerPod": 8, "trainer": {"tensorParallel": 3}}, "spec.trainer.tensorParallel", "divide"),
    ({"rewards": [{"type": "format"}]}, "spec.rewards.0.pattern", "pattern"),
    ({"rewards": [{"type": "format", "pattern": "("}]}, "spec.rewards.0.pattern", "regular expression"),
    # RE2, the API server's dialect: refused though Python's re compiles the last two
    ({"rewards": [{"type": "format", "pattern": "(<answer>"}]}, "spec.rewards.0.pattern", "not a valid RE2"),
    ({"rewards": [{"type": "format", "pattern": r"(a)\1"}]}, "spec.rewards.0.pattern", "not a valid RE2"),
    ({"rewards": [{"type": "format", "pattern": "(?=x)"}]}, "spec.rewards.0.pattern", "not a valid RE2"),
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


INST = """apiVersion: tandem.dev/v1alpha1
kind: RLHFJob
metadata: {name: j}
spec:
  model: {path: /models/m}
  rewards: [{type: answerMatch}]
  dataset:
    path: /data/p.jsonl
    systemPrompt: [INST] be brief [/INST]
"""


def test_a_yaml_error_names_file_line_and_column_without_a_traceback(tmp_path: Path) -> None:
    """An unquoted Llama-2 prompt: YAML reads `[INST] ...` as a list; rich once read `[/INST]` as markup."""
    (tmp_path / "llama.yaml").write_text(INST)
    result = runner.invoke(app, ["validate", str(tmp_path / "llama.yaml")])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)
    assert f"{tmp_path / 'llama.yaml'}:9:26: not valid YAML" in result.output, result.output
    assert "line 9, column 26" in result.output and "9 |     systemPrompt: [INST] be brief [/INST]" in result.output
    assert "quote text such as '[INST] ... [/INST]'" in result.output
    assert "Traceback" not in result.output and "MarkupError" not in result.output


@pytest.mark.parametrize(("spec", "field", "words"), [
    ({"gpusPerPod": "8"}, "spec.gpusPerPod", "'8' is quoted text; write the number without quotes"),
    ({"rollout": {"cudaGraphs": "false"}}, "spec.rollout.cudaGraphs", "write the true or false without quotes"),
    ({"rollout": {"temperature": "0.7"}}, "spec.rollout.temperature", "'0.7' is quoted text"),
    ({"algorithm": {"name": "kto", "clipC": 2.0}, "dataset": {"path": "/d", "completionField": "c",
                                                             "labelField": "l"}},
     "spec.algorithm.clipC", "does not apply to kto"),
    ({"algorithm": {"name": "ppo", "maskTruncated": True}}, "spec.algorithm.maskTruncated", "applies to grpo"),
    ({"algorithm": {"preset": "dapo"}, "rewards": [{"type": "model", "path": "/rm"}]},
     "spec.algorithm.dynamicSampling", "(algorithm.preset dapo sets dynamicSampling)"),
    ({"podTemplate": {"spec": {"hostNetwork": True}}}, "spec.podTemplate.spec.hostNetwork", "Pod Security restricted"),
    ({"podTemplate": {"spec": {"containers": [{"name": "trainer", "securityContext": {"runAsUser": 0}}]}}},
     "spec.podTemplate.spec.containers.0.securityContext.runAsUser", "Pod Security restricted"),
])
def test_each_refusal_names_the_field_the_job_wrote(tmp_path: Path, spec: dict[str, object], field: str,
                                                    words: str) -> None:
    result = runner.invoke(app, ["validate", str(_write(tmp_path, _job(**spec)))])
    assert result.exit_code == 1
    line = next((ln for ln in result.output.splitlines() if ln.strip().startswith(f"{field}:")), None)
    assert line is not None and words in line, result.output


def test_bracketed_text_is_printed_as_written(tmp_path: Path) -> None:
    result = runner.invoke(app, ["validate", str(_write(tmp_path, _job(**{"[bold]x[/bold]": 1, "[/INST]": 2})))])
    assert result.exit_code == 1
    assert "spec.[bold]x[/bold]: unknown field" in result.output and "spec.[/INST]: unknown field" in result.output


def test_a_pipe_gets_whole_lines(tmp_path: Path) -> None:
    """`tandem validate` writing to pipes (not a terminal): a path far beyond 80 columns stays on its line."""
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    job = _write(deep, _job(replicas=0), "a-job-file-with-a-long-name.yaml")
    bad = subprocess.run([sys.executable, "-m", "tandem.cli.main", "validate", str(job)], capture_output=True,
                         text=True, env={**os.environ, "COLUMNS": "80"}, check=False)
    assert bad.returncode == 1 and f"✗ {job}: invalid RLHFJob\n" in bad.stderr, bad.stderr
    ok = _write(deep, _job(), "valid.yaml")
    good = subprocess.run([sys.executable, "-m", "tandem.cli.main", "validate", str(ok)], capture_output=True,
                          text=True, check=False)
    assert good.returncode == 0 and f"✓ {ok}: RLHFJob j is valid\n" in good.stdout, good.stdout


def test_a_terminal_gets_text_not_markup_and_no_wrap() -> None:
    buf = io.StringIO()
    console = say.console(file=buf, force_terminal=True, width=40)
    long = "spec.rewards.0.pattern: [/INST] " + "x" * 100
    console.print(say.failed(long))
    printed = buf.getvalue()
    assert "\x1b[" in printed and "[/INST]" in printed  # styled (a terminal), the text as written
    assert printed.count("\n") == 1 and long in printed
