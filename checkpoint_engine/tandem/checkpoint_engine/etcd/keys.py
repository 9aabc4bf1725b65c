"""The etcd key schema of a job: one place that says where every record lives.

Callers: the checkpoint engines (versions, shards, readers, engine status), the trainer driver
(progress), the operator (reads progress for status, deletes the job prefix on deletion).
All values are JSON. Everything of a job lives under `job_prefix(namespace, scope(name, uid))`: the
`job` argument of every function below is that scope, `<name>/<uid>` with the RLHFJob's
metadata.uid, so a job created after another of the same name never reads (or deletes) the
earlier one's records, and an etcd role granting `/tandem/jobs/<ns>/<name>/` covers every
incarnation of one job name (`<job>` below stands for `<name>/<uid>`).

    /tandem/jobs/<ns>/<job>/progress                   driver: phase, iteration, metrics (JSON)
    /tandem/jobs/<ns>/<job>/gang                       driver: the gang generation now training (lease-free;
                                                       rollout-only pods kept through a gang restart follow it)
    /tandem/jobs/<ns>/<job>/versions/<v:012d>          version record, committed with its shards
    /tandem/jobs/<ns>/<job>/latest                     the newest complete version number
    /tandem/jobs/<ns>/<job>/shards/<v:012d>/<i:06d>    shard record (holder pod, file, bytes, checksum)
    /tandem/jobs/<ns>/<job>/holders/<v:012d>/<pod>     a pod that holds version v (serves it to others)
    /tandem/jobs/<ns>/<job>/readers/<v:012d>/<pod>     a reader pinning version v (lease-bound)
    /tandem/jobs/<ns>/<job>/receiving/<v:012d>/<pod>   a pod pulling version v (lease-bound; its
                                                       create revision orders the broadcast chain)
    /tandem/jobs/<ns>/<job>/transport/<pod>            where a pod's holder server listens (lease-bound)
    /tandem/jobs/<ns>/<job>/engines/<pod>/<role>       checkpoint-engine status (phase, version), lease-bound
    /tandem/jobs/<ns>/<job>/ops/<pod>/<role>/<id>      operations requested/completed on an engine
    /tandem/jobs/<ns>/<job>/endpoints/<pod>/<role>     where a sidecar's API listens, lease-bound
"""

from __future__ import annotations

ROOT = "/tandem/jobs/"


def scope(name: str, uid: str) -> str:
    """The key segment of one incarnation of job `name` (uid: its metadata.uid; "local" in tandem run
    without one). Raises ValueError on an empty or slashed part: keys of two jobs must never nest."""
    for part, what in ((name, "job name"), (uid, "job uid")):
        if not part or "/" in part:
            raise ValueError(f"etcd key scope: {what} {part!r} must be non-empty and contain no '/'")
    return f"{name}/{uid}"


def job_prefix(namespace: str, name: str) -> str:
    return f"{ROOT}{namespace}/{name}/"


def progress(namespace: str, name: str) -> str:
    return job_prefix(namespace, name) + "progress"


def gang(namespace: str, name: str) -> str:
    """The restart generation of the gang now training, written by its driver at start (lease-free)."""
    return job_prefix(namespace, name) + "gang"


def inflight(namespace: str, name: str) -> str:
    """What the driver had generated but not trained when it published a version (lease-free)."""
    return job_prefix(namespace, name) + "inflight"


def latest(namespace: str, name: str) -> str:
    return job_prefix(namespace, name) + "latest"


def version(namespace: str, name: str, v: int) -> str:
    return job_prefix(namespace, name) + f"versions/{v:012d}"


def versions_prefix(namespace: str, name: str) -> str:
    return job_prefix(namespace, name) + "versions/"


def shard(namespace: str, name: str, v: int, index: int) -> str:
    return job_prefix(namespace, name) + f"shards/{v:012d}/{index:06d}"


def shards_prefix(namespace: str, name: str, v: int) -> str:
    return job_prefix(namespace, name) + f"shards/{v:012d}/"


def holder(namespace: str, name: str, v: int, pod: str) -> str:
    return job_prefix(namespace, name) + f"holders/{v:012d}/{pod}"


def holders_prefix(namespace: str, name: str, v: int) -> str:
    return job_prefix(namespace, name) + f"holders/{v:012d}/"


def receiving(namespace: str, name: str, v: int, pod: str) -> str:
    return job_prefix(namespace, name) + f"receiving/{v:012d}/{pod}"


def receiving_prefix(namespace: str, name: str, v: int) -> str:
    return job_prefix(namespace, name) + f"receiving/{v:012d}/"


def transport_endpoint(namespace: str, name: str, pod: str) -> str:
    return job_prefix(namespace, name) + f"transport/{pod}"


def reader(namespace: str, name: str, v: int, pod: str) -> str:
    return job_prefix(namespace, name) + f"readers/{v:012d}/{pod}"


def readers_prefix(namespace: str, name: str, v: int) -> str:
    return job_prefix(namespace, name) + f"readers/{v:012d}/"


def engine(namespace: str, name: str, pod: str, role: str) -> str:
    return job_prefix(namespace, name) + f"engines/{pod}/{role}"


def op(namespace: str, name: str, pod: str, role: str, op_id: str) -> str:
    return job_prefix(namespace, name) + f"ops/{pod}/{role}/{op_id}"


def version_of(key: str) -> int:
    """The version number in a versions/, shards/, holders/ or readers/ key."""
    for part in key.split("/"):
        if len(part) == 12 and part.isdigit():
            return int(part)
    raise ValueError(f"no version number in etcd key {key!r}")


def endpoint(namespace: str, name: str, pod: str, role: str) -> str:
    return job_prefix(namespace, name) + f"endpoints/{pod}/{role}"


def endpoints_prefix(namespace: str, name: str) -> str:
    return job_prefix(namespace, name) + "endpoints/"
