"""Pure builders: an RLHFJob spec in, plain Kubernetes manifests (dicts) out; nothing here talks to the API server,
reads the clock or the environment.

Callers: `tandem.operator.runtime.reconcile` (creates what these return), `tandem run` (starts the pods of
`builders.build_pods` as local processes) and `tandem.operator.policies` (the pods' labels and names).
  builders         the Pods: their containers, the container env contract, volumes, probes
  job_objects      the job's names and labels, its Service, spec ConfigMap and token Secret
  pod_security     Pod Security restricted on every pod
  sandbox_pod      the `sandbox` container of codeExec jobs and the python tool
  pod_template     spec.podTemplate merged over each pod
  gpu_sharing      the trainer's and the rollout's GPUs in one pod (device plugin or DRA)
  etcd_access      the job's etcd TLS files and user in its pods
  tracking_access  MLflow's and W&B's credentials in the trainer container
  kueue            Kueue's plain pod-group contract (labels, gate, stop condition)
  gang             Workload and PodGroups of kube-scheduler's gang scheduling
  disruption       the hybrid pods' PodDisruptionBudget
  netpol_builder   the per-job NetworkPolicy
"""
