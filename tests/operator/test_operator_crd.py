"""The CI check for the one CRD source: both committed copies equal what the generator renders."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tandem.spec import crd

ROOT = Path(__file__).resolve().parents[2]
COPIES = [
    ROOT / "manifests" / "crd" / "rlhfjobs.tandem.dev.yaml",
    ROOT / "helm" / "tandem" / "crds" / "rlhfjobs.tandem.dev.yaml",
]


@pytest.mark.parametrize("path", COPIES, ids=lambda p: str(p.relative_to(ROOT)))
def test_committed_crd_equals_render(path: Path) -> None:
    assert path.read_text() == crd.render(), f"{path} is stale: regenerate it from tandem.spec.crd.render()"


def test_crd_shape() -> None:
    doc = yaml.safe_load(crd.render())
    version = doc["spec"]["versions"][0]
    assert doc["metadata"]["name"] == "rlhfjobs.tandem.dev" and version["subresources"] == {
        "status": {},
        "scale": {"specReplicasPath": ".spec.rolloutOnlyReplicas", "statusReplicasPath": ".status.rolloutOnlyReplicas",
                  "labelSelectorPath": ".status.rolloutOnlySelector"},
    }
    columns = [c["name"] for c in version["additionalPrinterColumns"] if not c.get("priority")]
    assert columns == ["Phase", "Reason", "Iteration", "Reward", "Eval", "Sync(s)", "Progress", "ETA", "Age"]
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]
    for col in version["additionalPrinterColumns"]:
        # every .status column names a field the status schema keeps (the API server prunes the rest),
        # with the column's type
        if not col["jsonPath"].startswith(".status."):
            continue
        node = status
        for part in col["jsonPath"].removeprefix(".status.").split("."):
            assert part in node.get("properties", {}), f"{col['name']}: {col['jsonPath']} not in the status schema"
            node = node["properties"][part]
        assert node["type"] == col["type"], col["name"]
    evaluated = next(c for c in version["additionalPrinterColumns"] if c["name"] == "Eval")
    assert evaluated["jsonPath"] == ".status.eval.passAt1" and evaluated["type"] == "number"
    assert "rlhf" in doc["spec"]["names"]["shortNames"]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    rules = [v["rule"] for v in spec.get("x-kubernetes-validations", [])]
    assert any("tensorParallel" in r for r in rules)
    assert {
        "rule": "self == oldSelf",
        "message": "replicas is immutable; create a new RLHFJob instead",
    } in spec["properties"]["replicas"]["x-kubernetes-validations"]
