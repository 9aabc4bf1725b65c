"""Regenerate manifests/tandem.yaml from the Helm chart (`python tests/operator/render_manifests.py`).

Caller: a developer after changing helm/tandem; tests/operator/test_operator_chart.py fails while the
committed file differs from this render. Needs only the helm binary from scripts/build-k8s.sh.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from controlplane import ControlPlane, missing_binaries  # noqa: E402
from harness import MANIFESTS, render_manifests  # noqa: E402


def main() -> int:
    if "helm" in missing_binaries():
        print("helm missing: run scripts/build-k8s.sh", file=sys.stderr)
        return 1
    cp = ControlPlane()  # not started: only its helm binary and environment are used
    try:
        (MANIFESTS / "tandem.yaml").write_text(render_manifests(cp))
    finally:
        cp.stop()
    print(MANIFESTS / "tandem.yaml")
    return 0


if __name__ == "__main__":
    sys.exit(main())
