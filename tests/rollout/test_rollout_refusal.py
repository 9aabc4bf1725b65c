"""`python -m tandem.sidecars.rollout` with an unusable model directory, or an environment whose module cannot
be imported: exit 2 with one line naming the file or module and the spec field (what the kubelet keeps as the
termination message), before vLLM, etcd or any port is touched."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tandem.spec.podenv import PodEnv


def run_rollout(tmp_path: Path, model: Path, **spec: Any) -> subprocess.CompletedProcess[str]:
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({"apiVersion": "tandem.dev/v1alpha1", "kind": "RLHFJob", "metadata": {"name": "j"},
                                   "spec": {"model": {"path": str(model)}, "dataset": {"path": "/d.jsonl"},
                                            "gpusPerPod": 0, "rewards": [{"type": "answerMatch"}], **spec}}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_")}
    env.update(PodEnv.environ(job="j", role="rollout", pod="j-0", job_file=job, port=1,
                              etcd_endpoints="http://127.0.0.1:1"))
    return subprocess.run([sys.executable, "-m", "tandem.sidecars.rollout"], env=env, capture_output=True,
                          text=True, timeout=300, check=False)


@pytest.mark.parametrize(("files", "words"), [
    ({"tokenizer.json": "{}"}, "config.json is missing (a HuggingFace model directory has one)"),
    ({"config.json": json.dumps({"model_type": "qwen2"})}, "has no tokenizer files (none of tokenizer.json, "),
])
def test_the_entry_point_refuses_in_one_line(tmp_path: Path, files: dict[str, str], words: str) -> None:
    model = tmp_path / "model"
    model.mkdir()
    for name, text in files.items():
        (model / name).write_text(text)
    done = run_rollout(tmp_path, model)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"tandem.rollout ERROR spec.model.path: {model}" in lines[0], done.stderr
    assert words in lines[0]


def test_an_environment_that_cannot_be_imported_is_refused_in_one_line(tmp_path: Path) -> None:
    from tandem.cli import pretrained

    environment = {"type": "agent", "entryPoint": "no_such_agents.mod:run", "pythonPath": [str(tmp_path)]}
    done = run_rollout(tmp_path, Path(pretrained.fetch("smollm2-135m")), rollout={"environment": environment})
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "spec.rollout.environment.entryPoint: cannot import 'no_such_agents.mod'" in lines[0], lines[0]
