"""One checkpoint engine as a service: the trainer's core, the status both cores report, and their HTTP face.

`publisher` (the trainer-side core: named HF tensors -> a shared-memory version -> etcd), `engine_status` (the
status and report shapes of both cores, the publisher and the rollout engine), `api` (the FastAPI control API
over either core) and `metrics` (the Prometheus view of a core, read at scrape time). Stands on `..versions`
and `..etcd`. Callers: the trainer's loop (publisher, api), the rollout engine (`engine_status`, `api`) and the
rollout sidecar.
"""
