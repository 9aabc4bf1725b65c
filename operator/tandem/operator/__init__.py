"""The RLHFJob Kubernetes operator: pure builders, pure status/restart policies, thin kopf handlers.

Callers: `python -m tandem.operator` (the chart's Deployment) and `tandem run`, which starts the
pods of `builders.build_pods` as local processes. Modules (imported as modules, not names):
  builders        spec -> Service, ConfigMap, Secret, Pods (the container env contract lives here)
  observe         pod manifest -> PodState summary
  status          phase, conditions, progress fields, transition events
  restart_policy  gang-restart decisions and backoff
  plan            the pure reconcile decision
  reconcile       one pass: observe, decide, act (API + etcd I/O)
  kube, etcd_store  the I/O edges
  config          operator settings from the environment
  handlers        kopf registrations (imported by __main__ only)
"""

from tandem.operator import builders, observe, plan, restart_policy, status
from tandem.operator.builders import build_pods

__all__ = ["build_pods", "builders", "observe", "plan", "restart_policy", "status"]
