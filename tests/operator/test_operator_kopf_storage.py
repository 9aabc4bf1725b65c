"""The lean diff-base storage extracts exactly the essence kopf's stock annotation storage does."""

from __future__ import annotations

import copy
from typing import Any

import kopf
import pytest

from tandem.operator.kopf_storage import LeanDiffBaseStorage


def body(**extra: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "apiVersion": "tandem.dev/v1alpha1", "kind": "RLHFJob",
        "metadata": {
            "name": "j", "namespace": "ns", "uid": "u-1", "resourceVersion": "42", "generation": 3,
            "labels": {"team": "rl"},
            "annotations": {"note": "keep me", "tandem.dev/last-handled-configuration": "{}",
                            "kubectl.kubernetes.io/last-applied-configuration": "{...}"},
            "finalizers": ["tandem.dev/cleanup"],
            "managedFields": [{"manager": "tandem-operator", "fieldsV1": {"f:status": {"f:phase": {}}}}] * 20,
        },
        "spec": {"model": {"path": "/m"}, "rewards": [{"type": "answerMatch"}], "replicas": 2},
        "status": {"phase": "Running", "iteration": 12, "conditions": [{"type": "Ready", "status": "True"}]},
    }
    doc.update(extra)
    return doc


@pytest.mark.parametrize("doc", [
    body(),
    body(metadata={"name": "bare"}),  # no labels or annotations at all
    body(status=None),
    {k: v for k, v in body().items() if k != "status"},
    body(spec={"nested": {"list": [{"a": 1}, {"b": [2, 3]}]}}),
], ids=["full", "bare-metadata", "null-status", "no-status", "nested-spec"])
def test_same_essence_as_the_stock_storage(doc: dict[str, Any]) -> None:
    stock = kopf.AnnotationsDiffBaseStorage(prefix="tandem.dev")
    lean = LeanDiffBaseStorage(prefix="tandem.dev")
    want = stock.build(body=kopf.Body(copy.deepcopy(doc)))
    got = lean.build(body=kopf.Body(copy.deepcopy(doc)))
    assert got == want


def test_the_essence_is_a_copy() -> None:
    doc = body()
    essence = LeanDiffBaseStorage(prefix="tandem.dev").build(body=kopf.Body(doc))
    essence["spec"]["replicas"] = 99  # type: ignore[index]
    essence["metadata"]["labels"]["team"] = "x"  # type: ignore[index]
    assert doc["spec"]["replicas"] == 2 and doc["metadata"]["labels"]["team"] == "rl"


def test_extra_fields_take_the_stock_path() -> None:
    doc = body()
    stock = kopf.AnnotationsDiffBaseStorage(prefix="tandem.dev")
    lean = LeanDiffBaseStorage(prefix="tandem.dev")
    fields = ["status.phase"]
    assert lean.build(body=kopf.Body(doc), extra_fields=fields) == stock.build(body=kopf.Body(doc), extra_fields=fields)
    assert lean.build(body=kopf.Body(doc), extra_fields=fields)["status"] == {"phase": "Running"}  # type: ignore[index]
