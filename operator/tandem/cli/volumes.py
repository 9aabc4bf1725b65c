"""`tandem run`'s stand-in for volume mounts: paths under a hostPath volume become host paths.

Role: in a cluster the pod builders mount each `spec.volumes` entry at its mountPath, and the
job's paths (model, dataset, eval dataset, reference, reward models, durable checkpoints, HF exports) point into those
mounts. On one machine there is no container runtime, so the same spec runs by rewriting every
such path from `<mountPath>/rest` to `<hostPath>/rest` — the one-machine meaning of a bind
mount (each volume's mountPath becomes its hostPath too, so the rewritten spec still passes
its own rules when the sidecars load it). A PersistentVolumeClaim has no meaning here and is refused, naming the field.
Callers: `tandem run` (`tandem.cli.main.run`, before `local.run_job` writes the job file the sidecars
read) and the gang-restart test, which plays the kubelet for the operator's pods.
"""

from __future__ import annotations

from tandem.spec.load import SpecError
from tandem.spec.models import RLHFJob, under


def localize(job: RLHFJob, source: str = "<job>") -> RLHFJob:
    """A copy of `job` whose paths under hostPath volumes point at the host directories."""
    spec = job.spec
    bad = [(f"spec.volumes[{i}].claimName", "tandem run mounts hostPath volumes only; a PersistentVolumeClaim "
            "needs a cluster (use hostPath with a local directory)")
           for i, v in enumerate(spec.volumes) if v.claim_name is not None]
    if bad:
        raise SpecError(source, bad)
    mounts = sorted(((v.mount_path, v.host_path) for v in spec.volumes if v.host_path is not None),
                    key=lambda m: len(m[0]), reverse=True)  # the deepest mount wins, as in a container

    def host(path: str) -> str:
        for mount, target in mounts:
            if under(path, mount):
                return target + path[len(mount):]
        return path

    out = job.model_copy(deep=True)
    s = out.spec
    s.model.path = host(s.model.path)
    s.dataset.path = host(s.dataset.path)
    if s.eval is not None:
        s.eval.dataset.path = host(s.eval.dataset.path)
    if s.reference.path is not None:
        s.reference.path = host(s.reference.path)
    if s.algorithm.distillation is not None:
        s.algorithm.distillation.teacher = host(s.algorithm.distillation.teacher)
    for reward in s.rewards:
        if reward.path is not None:
            reward.path = host(reward.path)
    if s.checkpoint_engine.persist is not None:
        s.checkpoint_engine.persist.path = host(s.checkpoint_engine.persist.path)
    if s.export is not None:
        s.export.path = host(s.export.path)
    for v in s.volumes:  # "mounted" where it lies, so the spec's own rules still hold for the sidecars
        if v.host_path is not None:
            v.mount_path = v.host_path
    return out
