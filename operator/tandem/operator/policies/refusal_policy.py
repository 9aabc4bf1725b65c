"""Pods the API server refuses to create (Pod Security admission, a ResourceQuota, a webhook, RBAC):
which answers are refusals, and when to ask again. Pure.

Caller: `tandem.operator.runtime.reconcile` (`carry_out` collects the refusals of a pass; `run` shows the
API server's message in the status with reason PodCreateRefused, posts an Event when it changes,
and creates no pods until `retry_delay` has passed).

A refusal is an answer the same request will get again until someone changes the namespace, its
quota or the job: 400 (a webhook's or a malformed object's), 403 (Forbidden: PodSecurity, exceeded
quota, RBAC, a webhook's default), 422 (Invalid). Other errors (5xx, timeouts) are the API server's
trouble and raise as before (kopf retries the pass). Retries back off 5 s, 10 s, 20 s, ... up to 5
minutes, so a refused job costs a create request every few minutes, not one per reconcile pass.
"""

from __future__ import annotations

REFUSALS = frozenset({400, 403, 422})
REASON = "PodCreateRefused"
FIRST_RETRY_S, MAX_RETRY_S = 5.0, 300.0


def refused(status: int) -> bool:
    return status in REFUSALS


def retry_delay(refusals: int) -> float:
    """Seconds to wait after the `refusals`-th refusal in a row (1 = the first)."""
    return min(MAX_RETRY_S, FIRST_RETRY_S * 2.0 ** max(0, min(refusals, 32) - 1))
