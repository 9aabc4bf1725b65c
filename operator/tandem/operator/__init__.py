"""The RLHFJob Kubernetes operator, one folder per role; each stands only on those listed before it.

Callers: `python -m tandem.operator` (`__main__.py`, the chart's Deployment) and `tandem run`, which starts the
pods of `manifests.builders.build_pods` as local processes. Import the modules of a folder, never this package:
  manifests/  pure builders: an RLHFJob spec in, Kubernetes objects out (pods, their security, templates and
              GPU sharing; Service, ConfigMap, Secret, NetworkPolicy, PodDisruptionBudget, Workload; Kueue's marks)
  policies/   pure decisions: a pod's summary (observe), the reconcile decision (plan, a table of rules) and the
              policies it consults (*_policy, eta), the job's status (job_status); leader election's decision
  cluster/    the I/O edges: the Kubernetes API (kube) and the job's etcd keys (etcd_store)
  runtime/    the running operator: kopf handlers, one reconcile pass (observe, decide, act), leader election,
              settings from the environment, metrics, log hygiene
`.importlinter` keeps the folders acyclic; the operator imports none of `tandem.sidecars`.
"""
