"""`tandem run`'s hostPath volumes also carry spec.export.path and spec.eval.dataset.path.

Both are paths the trainer uses inside the pod: an export directory must lie on a writable volume (a
rule the sidecars check again when they load the rewritten job), and the eval prompts may live on one.
Left as the pod's paths, the sidecars refused the job ("spec.export.path: must lie on a writable
volume") or would have read and written outside the host directory.
"""

from __future__ import annotations

import yaml

from tandem.cli.volumes import localize
from tandem.spec.load import parse_job


def test_export_and_eval_paths_under_host_path_mounts_are_rewritten() -> None:
    doc = {"apiVersion": "tandem.dev/v1alpha1", "kind": "RLHFJob", "metadata": {"name": "j"}, "spec": {
        "model": {"path": "/models/qwen"}, "dataset": {"path": "/data/train.jsonl"},
        "eval": {"dataset": {"path": "/data/test.jsonl"}},
        "rewards": [{"type": "answerMatch"}],
        "volumes": [{"name": "data", "mountPath": "/data", "hostPath": "/srv/d"},
                    {"name": "out", "mountPath": "/out", "hostPath": "/srv/out"}],
        "export": {"path": "/out/hf", "every": 2},
    }}
    out = localize(parse_job(doc)).spec
    assert out.export is not None and out.export.path == "/srv/out/hf"
    assert out.eval is not None and out.eval.dataset.path == "/srv/d/test.jsonl"
    # what the sidecars load (job.yaml) passes the same rules: export.path lies on a (rewritten) volume
    parse_job(yaml.safe_load(yaml.safe_dump({**doc, "spec": out.model_dump(mode="json", by_alias=True,
                                                                           exclude_none=True)})))
