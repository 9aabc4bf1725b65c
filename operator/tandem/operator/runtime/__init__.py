"""The running operator: kopf's handlers and what they drive, over the pure builders and decisions.

Caller: `tandem.operator.__main__` (imports `handlers`, which registers them with kopf).
  handlers      kopf handlers (startup, pod index, the reconcile timer, the finalizer)
  reconcile     one pass of one job: observe, decide (`policies.plan`), write the status, act
  leader        leader election over a Lease among replicas
  env_settings  the operator's settings from its environment
  metrics       Prometheus metrics of the jobs and of reconciling
  kopf_storage  kopf without a diff-base (level-triggered)
  log_hygiene   kopf's routine success lines dropped
"""
