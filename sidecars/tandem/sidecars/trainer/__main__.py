"""`python -m tandem.sidecars.trainer`: the trainer container's entry point.

Reads the pod environment (`PodEnv`), refuses to start when the spec asks for GPUs and CUDA is not
usable (`gpu.select`; gpusPerPod 0 runs on the CPU) or when a model directory or a dataset row cannot
be used (`preflight`: one line naming the file and the field, also the termination message), applies
the CPU compatibility layer on CPU, starts one process per local trainer rank (gloo on CPU, NCCL on
GPUs) with global ranks derived from the pod index, and runs the driver loop (`driver.run`). SIGTERM stops it cleanly.
A failure ends with one line naming pod, component and cause (also the termination message); a failure the job's
own bounds decide (`BOUNDED`: no healthy rollout within failurePolicy.rolloutUnavailableSeconds, a rollout's
answer another rollout would not change) is only that line, any other also logs its traceback before it.
Caller: the pod built by `tandem.operator.manifests.builders` (in a cluster) or `tandem run` (locally).
"""

from __future__ import annotations

import logging
import re

from tandem.sidecars import gpu, gpu_share
from tandem.sidecars.startup import leave, refuse, start_sidecar
from tandem.sidecars.trainer.loop import preflight
from tandem.sidecars.trainer.loop.rollout.rollout_health import RolloutError
from tandem.sidecars.trainer.rank import run_rank
from tandem.spec import model_dir

log = logging.getLogger("tandem.trainer")
BOUNDED: tuple[type[Exception], ...] = (RolloutError,)  # their message names the cause; a traceback adds nothing
_QUALIFIED = re.compile(r"^(?:\w+\.)+(?=\w+: )")  # a traceback's last line names the class with its module


def main() -> int:
    started = start_sidecar(log)
    if started is None:
        return 2
    env, job = started
    try:  # gpusPerPod > 0: CUDA or a clear refusal, never a quiet CPU run
        gpu.select(job.spec.gpus_per_pod, "trainer")
        if env.gpu_ids_file is not None:  # the rollout of this pod waits for them (gpuAllocation devicePlugin)
            gpu_share.publish(env.gpu_ids_file, gpu_share.trainer_ids())
    except gpu.NoUsableGpu as e:
        return refuse(log, str(e), 3)
    try:
        preflight.check(job.spec)
    except (preflight.PreflightError, model_dir.ModelDirError) as e:
        return refuse(log, str(e))
    ranks = job.spec.trainer_ranks_per_pod()
    try:
        if ranks == 1:
            run_rank(0, env, 1)
        else:
            import torch.multiprocessing as mp

            mp.spawn(run_rank, args=(env, ranks), nprocs=ranks, join=True)  # importable target, not __main__
    except Exception as e:  # one line naming pod, component and cause; the traceback of an unforeseen one first
        if not bounded(e):
            log.exception("trainer failed")
        return refuse(log, f"pod {env.pod}, trainer: {one_line(e)}", 1)
    return 0


def one_line(e: BaseException) -> str:
    """The cause of a failure in one line: a rank's exception as mp.spawn reports it is a traceback, whose
    last line is the error (its class named without its module)."""
    text = str(e).strip()
    lines = [line for line in text.splitlines() if line.strip()]
    last = lines[-1].strip() if lines else type(e).__name__
    return _QUALIFIED.sub("", last) if len(lines) > 1 else f"{type(e).__name__}: {last}"


def bounded(e: BaseException) -> bool:
    """`e` is one of `BOUNDED` (or a subclass), raised here or in a rank mp.spawn started (then the text of its
    traceback, whose last line names the class with its module)."""
    if isinstance(e, BOUNDED):
        return True
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    module, _, name = lines[-1].partition(":")[0].rpartition(".") if len(lines) > 1 else ("", "", "")
    return any((k.__module__, k.__name__) == (module, name) for c in BOUNDED for k in _family(c))


def _family(c: type[Exception]) -> list[type[Exception]]:
    return [c, *(k for sub in c.__subclasses__() for k in _family(sub))]


if __name__ == "__main__":
    leave(main())
