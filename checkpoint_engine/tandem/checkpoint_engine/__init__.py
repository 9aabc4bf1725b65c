"""Checkpoint engine: weights moved from the trainer to the rollouts through shared memory, etcd and the network.

By concern: `versions/` (a weight version's bytes: the shared-memory layout, checksums, spare shard files, the
delta codec, adapter-only versions, durable copies, HF export), `etcd/` (the registry of versions in etcd, its
key schema, endpoints, failover and security, a local etcd for `tandem run` and the tests), `service/` (one
engine as a service: the trainer's publisher, the status both cores report, the HTTP control API, Prometheus),
`transport/` (the cross-pod broadcast: holder servers, receivers, TCP and RDMA), `convert/` (Megatron <->
HuggingFace weights). At the root, what every part uses: `errors` (typed errors, with their HTTP statuses) and
`ports` (free TCP ports). Layers: `versions` stands on the root modules only, `etcd` on `versions`, `service`
and `transport` on both. Imports nothing of the sidecars or the operator, which import it.
"""
