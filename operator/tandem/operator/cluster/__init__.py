"""The operator's I/O edges: the Kubernetes API and the jobs' etcd keys.

Callers: `tandem.operator.runtime` (the handlers and the reconcile pass) and `tandem.operator.__main__`.
  kube        asyncio access to the API server: create-if-absent, delete, label, list, status patches
  etcd_store  a job's progress record read, its keys deleted (the finalizer), with the operator's etcd credentials
"""
