"""Shared checks of a cross-field rule's two enforcements, offline (`tandem.spec.load.parse_job`, what
`tandem validate` prints) and by the real API server (the CRD's CEL, a server-side dry run). Used by the
rule tests of one feature each (test_kto_rules.py, test_engine_rules.py; test_environment_rules.py binds
the four tests `rule_tests` makes)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from controlplane import ControlPlane
from wrappers import JobWrapper

from tandem.spec.load import SpecError, parse_job


def model_dir(tmp_path: Path, model_type: str) -> str:
    """A model directory holding only a config.json of `model_type` (what the rules read of a model)."""
    (tmp_path / model_type).mkdir()
    (tmp_path / model_type / "config.json").write_text(json.dumps({"model_type": model_type}))
    return str(tmp_path / model_type)


def refused_offline(case: str, build: Callable[[], JobWrapper], field: str, words: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_job(build().obj(), case)
    assert field in err.value.fields and words in str(err.value), str(err.value)


def server_dry_run(installed: ControlPlane, case: str,
                   build: Callable[[], JobWrapper]) -> subprocess.CompletedProcess[str]:
    doc = build().meta("name", case).obj()
    return installed.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(doc), check=False)


def refused_by_api_server(installed: ControlPlane, case: str, build: Callable[[], JobWrapper], field: str,
                          words: str) -> None:
    out = server_dry_run(installed, case, build)
    assert out.returncode != 0, f"{case} was accepted"
    assert field in out.stderr and words in out.stderr, out.stderr


Rejected = list[tuple[str, Callable[[], JobWrapper], str, str]]
Accepted = list[tuple[str, Callable[[], JobWrapper]]]


def rule_tests(rejected: Rejected, accepted: Accepted) -> tuple[Callable[..., None], ...]:
    """The four tests of a feature's rules, parametrized over its cases: offline refusals naming the field,
    offline acceptances, and the same two against the real API server (k8s). A test module binds them to
    test_* names."""
    r_ids, a_ids = [c[0] for c in rejected], [c[0] for c in accepted]

    @pytest.mark.parametrize(("case", "build", "field", "words"), rejected, ids=r_ids)
    def offline_refuses(case: str, build: Callable[[], JobWrapper], field: str, words: str) -> None:
        refused_offline(case, build, field, words)

    @pytest.mark.parametrize(("case", "build"), accepted, ids=a_ids)
    def offline_accepts(case: str, build: Callable[[], JobWrapper]) -> None:
        parse_job(build().obj(), case)

    @pytest.mark.k8s
    @pytest.mark.parametrize(("case", "build", "field", "words"), rejected, ids=r_ids)
    def server_refuses(installed: ControlPlane, case: str, build: Callable[[], JobWrapper], field: str,
                       words: str) -> None:
        refused_by_api_server(installed, case, build, field, words)

    @pytest.mark.k8s
    @pytest.mark.parametrize(("case", "build"), accepted, ids=a_ids)
    def server_accepts(installed: ControlPlane, case: str, build: Callable[[], JobWrapper]) -> None:
        out = server_dry_run(installed, case, build)
        assert out.returncode == 0, out.stderr

    return offline_refuses, offline_accepts, server_refuses, server_accepts
