"""Shared checks of a cross-field rule's two enforcements, offline (`tandem.spec.load.parse_job`, what
`tandem validate` prints) and by the real API server (the CRD's CEL, a server-side dry run). Used by the
rule tests of one feature each (test_kto_rules.py, test_engine_rules.py)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable

import pytest
from controlplane import ControlPlane
from wrappers import JobWrapper

from tandem.spec.load import SpecError, parse_job


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
