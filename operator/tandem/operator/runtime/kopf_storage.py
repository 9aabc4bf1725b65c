"""kopf's diff-base storage, switched off: the operator is level-triggered and never reads a diff.

Role: kopf extracts every RLHFJob event's "essence" (spec, labels, annotations; deep-copied twice)
to tell creations and updates apart, and after a creation writes that essence back into the object
as the `<prefix>/last-handled-configuration` annotation. The operator has no creation, update or
field handlers: a timer reconciles each job from its whole spec, and the only changing handler is
the deletion (finalizer) handler, which kopf recognises by `deletionTimestamp`, not by a diff. So
the essence was pure cost, and it grew with the spec: with a GPU cluster's `spec.podTemplate`, 100
jobs created at once meant 100 more PATCHes carrying a copy of each spec, an object twice its size
in every later watch event and status-patch reply, and the largest share of the operator's CPU
(bench/operator_scale.py, py-spy).

`NoDiffBaseStorage` reports the same empty essence for the old and the new state: every event is
a no-change event to kopf (NOOP, or RESUME at start-up), nothing is written, nothing is copied.
Deletion handling is unchanged. An operator that adds on.create/on.update/on.field handlers must
put a real storage back: tests/operator/test_operator_kopf_storage.py fails while one is registered.
Caller: `tandem.operator.runtime.handlers.startup` (settings.persistence.diffbase_storage).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

import kopf


class NoDiffBaseStorage(kopf.DiffBaseStorage):  # type: ignore[misc]
    def build(self, *, body: kopf.Body, extra_fields: Iterable[Any] | None = None) -> kopf.BodyEssence:
        if extra_fields:  # a handler asked kopf to watch a field: it would never fire with this storage
            raise RuntimeError(f"NoDiffBaseStorage cannot watch fields {sorted(map(str, extra_fields))}")
        return cast(kopf.BodyEssence, {})

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return cast(kopf.BodyEssence, {})  # never None: None would make every event a creation

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None
