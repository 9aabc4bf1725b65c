"""The checkpoint engine's etcd: the registry of weight versions and what every etcd client of the project shares.

`keys` (the etcd key schema of a job), `endpoints` (the one parser of etcd endpoints), `security` (TLS and
user/password of every etcd client), `failover` (every member of one cluster behind one client),
`version_registry` (the asyncio registry of versions, reader pins, engine statuses and operations),
`sync_registry` (its blocking facade on a private event loop) and `local_etcd` (a private etcd server for
`tandem run` and the tests). Stands on `..versions` (`VersionIndex`). Callers: the publisher, the transports,
the rollout engine and sidecar, the trainer's loop, the operator (`endpoints`, `security`, `keys`) and the CLI.
"""
