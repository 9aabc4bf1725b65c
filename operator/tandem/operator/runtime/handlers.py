"""kopf handlers of the RLHFJob operator: thin glue between kopf and `tandem.operator.runtime.reconcile`.

Callers: kopf, after `tandem.operator.__main__` imports this module (importing registers them).
- startup/cleanup: settings (annotation-based progress storage, no diff-base: `kopf_storage`, finalizer
  name), API and etcd clients.
- `job_pods` index: every pod labelled tandem.dev/job, summarised, keyed by (namespace, job).
- `reconcile_job` timer: one level-triggered pass per job every TANDEM_RECONCILE_INTERVAL seconds,
  starting as soon as the job is seen (creation, operator restart, resume all look the same).
- `delete_job_keys`: on deletion, removes the job's etcd prefix (the finalizer); owned objects go
  with the garbage collector.
- Prometheus metrics (`tandem.operator.runtime.job_metrics`): served from startup, set after each pass.
"""

from __future__ import annotations

import logging
from typing import Any

import kopf

from tandem.operator.cluster.etcd_store import EtcdStore, EtcdUnavailable
from tandem.operator.cluster.kube import Kube, connect
from tandem.operator.manifests.job_objects import LABEL_JOB
from tandem.operator.policies.observe import pod_state
from tandem.operator.runtime import job_metrics, reconcile
from tandem.operator.runtime.env_settings import OperatorConfig
from tandem.operator.runtime.kopf_storage import NoDiffBaseStorage
from tandem.spec.load import SpecError, parse_spec
from tandem.spec.models import GROUP, PLURAL, VERSION

CONFIG = OperatorConfig.from_env()
FINALIZER = "tandem.dev/cleanup"


@kopf.on.startup()  # type: ignore[untyped-decorator]
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="tandem.dev")
    settings.persistence.diffbase_storage = NoDiffBaseStorage()  # level-triggered: no essence, no diff
    settings.posting.reporting_component = "tandem-operator"
    settings.posting.level = logging.WARNING  # only our own Events (kopf.event) and real problems
    settings.watching.server_timeout = 300
    settings.networking.request_timeout = 30
    settings.background.instant_exit_timeout = 5.0  # let a running reconcile finish before cleanup
    memo.kube = Kube(await connect(CONFIG.max_connections))
    memo.etcd = EtcdStore(CONFIG.etcd_timeout, CONFIG.etcd_security)
    job_metrics.serve(CONFIG.metrics_port)


@kopf.on.cleanup()  # type: ignore[untyped-decorator]
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    await memo.kube.close()
    await memo.etcd.close()


@kopf.index("pods", labels={LABEL_JOB: kopf.PRESENT})  # type: ignore[untyped-decorator]
async def job_pods(body: kopf.Body, namespace: str, **_: Any) -> dict[tuple[str, str], Any] | None:
    # async: kopf runs a plain `def` handler in its thread pool, a hop per pod event
    state = pod_state(body)
    return {(namespace, state.job): state} if state is not None else None


@kopf.timer(
    GROUP,
    VERSION,
    PLURAL,
    interval=CONFIG.reconcile_interval,
    initial_delay=0,
    backoff=max(1.0, CONFIG.reconcile_interval),
)  # type: ignore[untyped-decorator]
async def reconcile_job(
    body: kopf.Body,
    meta: kopf.Meta,
    spec: kopf.Spec,
    status: kopf.Status,
    name: str,
    namespace: str,
    uid: str,
    memo: kopf.Memo,
    job_pods: kopf.Index,
    logger: logging.Logger,
    **_: Any,
) -> None:
    memory = memo.get("job")
    if memory is None:
        memory = memo["job"] = reconcile.JobMemory()
    ref = reconcile.JobRef(
        namespace, name, uid, int(meta.get("generation") or 0), str(meta.get("resourceVersion") or "0"),
        dict(meta.get("labels") or {}),
    )
    with job_metrics.observe_pass():
        plan = await reconcile.run(
            kube=memo.kube,
            etcd=memo.etcd,
            memory=memory,
            ref=ref,
            spec=spec,
            raw_status=dict(status),
            indexed_pods=job_pods.get((namespace, name), ()),
            default_etcd=CONFIG.etcd_endpoints,
            logger=logger,
            policy_from=CONFIG.network_policy_extra_from if CONFIG.job_network_policy else None,
            scrape_from=CONFIG.network_policy_scrape_from,
        )
    if plan is not None:
        job_metrics.record(namespace, name, plan)
    for event in plan.events if plan else ():  # kopf.event: posted whatever settings.posting.level says
        kopf.event(body, type=event.type, reason=event.reason, message=event.message)


@kopf.on.delete(GROUP, VERSION, PLURAL, backoff=5)  # type: ignore[untyped-decorator]
async def delete_job_keys(
    spec: kopf.Spec,
    name: str,
    namespace: str,
    uid: str,
    body: kopf.Body,
    memo: kopf.Memo,
    retry: int,
    logger: logging.Logger,
    **_: Any,
) -> None:
    try:
        endpoints = list(parse_spec(dict(spec), name=name).spec.checkpoint_engine.etcd.endpoints)
    except SpecError:
        endpoints = []
    try:
        deleted = await memo.etcd.delete_job(endpoints or CONFIG.etcd_endpoints, namespace, name, uid)
    except EtcdUnavailable as e:
        if retry < CONFIG.finalizer_retries:
            raise kopf.TemporaryError(f"etcd unavailable, will retry: {e}", delay=5) from None
        kopf.event(body, type="Warning", reason="EtcdCleanupSkipped", message=f"gave up deleting etcd keys: {e}")
        job_metrics.forget(namespace, name)
        return
    job_metrics.forget(namespace, name)
    logger.info(f"deleted {deleted} etcd keys of {namespace}/{name}")
