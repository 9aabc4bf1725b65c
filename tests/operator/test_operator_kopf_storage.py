"""The operator runs kopf without a diff-base: no essence copied, none written back into the job.

The cost it removes is measured in bench/operator_scale.py; here: what kopf decides with it, from
kopf's own cause detection, and the guard that keeps it safe (no handler that would need a diff).
"""

from __future__ import annotations

import copy
from typing import Any

import kopf
import pytest
from kopf._core.intents import causes  # kopf's own cause detection: what the storage must keep right

from tandem.operator.runtime import handlers
from tandem.operator.runtime.kopf_storage import NoDiffBaseStorage


def body(**extra: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "apiVersion": "tandem.dev/v1alpha1", "kind": "RLHFJob",
        "metadata": {"name": "j", "namespace": "ns", "uid": "u-1", "resourceVersion": "42", "generation": 3,
                     "labels": {"team": "rl"}, "finalizers": [handlers.FINALIZER]},
        "spec": {"model": {"path": "/m"}, "podTemplate": {"spec": {"nodeSelector": {"gpu": "h100"}}}},
    }
    doc.update(extra)
    return doc


def cause(doc: dict[str, Any], event: str = "MODIFIED", initial: bool = False) -> causes.Reason:
    storage, b = NoDiffBaseStorage(), kopf.Body(doc)
    old, new = storage.fetch(body=b), storage.build(body=b, extra_fields=set())
    assert old == new == {}  # whatever the body holds
    return causes.detect_changing_cause(finalizer=handlers.FINALIZER, raw_event={"type": event, "object": doc},
                                        body=b, old=old, new=new, diff=kopf.Diff([]), initial=initial, resource=None,
                                        logger=None, patch=kopf.Patch(), memo=None, indices=None).reason


def test_nothing_is_written_or_copied() -> None:
    storage, doc = NoDiffBaseStorage(), body()
    patch = kopf.Patch()
    storage.store(body=kopf.Body(doc), patch=patch, essence=storage.build(body=kopf.Body(doc)))
    assert not patch  # no last-handled-configuration annotation: one PATCH less per new job
    assert storage.build(body=kopf.Body(doc)) == {} and storage.fetch(body=kopf.Body(doc)) == {}


def test_kopf_sees_no_creation_or_update_but_still_sees_the_deletion() -> None:
    assert cause(body(), event="ADDED") == causes.Reason.NOOP  # not CREATE: nothing to store afterwards
    changed = body(spec={"model": {"path": "/other"}})
    assert cause(changed) == causes.Reason.NOOP  # the timer reconciles from the whole spec anyway
    assert cause(body(), initial=True) == causes.Reason.RESUME  # start-up listing: no handler, no write
    deleting = body()
    deleting["metadata"]["deletionTimestamp"] = "2026-11-25T00:00:00Z"
    assert cause(deleting) == causes.Reason.DELETE  # the finalizer handler runs
    freed = copy.deepcopy(deleting)
    freed["metadata"]["finalizers"] = []
    assert cause(freed) == causes.Reason.FREE


def test_only_the_deletion_handler_depends_on_changes() -> None:
    """A creation, update or field handler would never fire without a diff-base: this fails first."""
    registered = kopf.get_default_registry()._changing.get_all_handlers()
    assert [(h.id, h.reason) for h in registered] == [("delete_job_keys", causes.Reason.DELETE)]
    assert all(h.field is None for h in registered)


def test_a_watched_field_is_refused() -> None:
    with pytest.raises(RuntimeError, match="status.phase"):
        NoDiffBaseStorage().build(body=kopf.Body(body()), extra_fields=["status.phase"])
