"""`tandem run`: one RLHFJob on one machine, from the same pod builders the operator uses.

Role: start a private etcd, build the job's pods with `tandem.operator.manifests.builders.build_pods`, run
each container as a local process (`tandem.cli.local_procs`), follow the driver's progress record in
etcd with a live display (on a terminal; else one plain line per iteration, `progress_lines`), write
metrics/plots under the run directory, and stop everything cleanly
on completion, failure or Ctrl-C; a rollout process that dies is started again (`supervise`), as the kubelet
restarts a native sidecar and the operator replaces a rollout-only pod, and a run that fails ends with one line
naming the pod, the component and the cause. A second run of the same namespace/name on this machine refuses with
one line (`exclusive`: both would share one shared-memory root). Caller: `tandem.cli.main.run`.

Run directory layout (`<workdir>/<job>/`): job.yaml (the resolved spec the sidecars read),
logs/<pod>-<container>.log, metrics.jsonl (one line per iteration, written by the driver),
progress.png (reward, eval pass@1 and phase timings), eval.jsonl (held-out evaluations,
`spec.eval`), tensorboard/ (event files of every metric), etcd/ (removed at the end unless --keep-etcd), job-uid
(the run's stand-in for metadata.uid: durable checkpoints of `checkpointEngine.persist` are kept
per uid, and `--resume` reuses it), generation (each `--resume` starts the next gang generation, as a
gang restart in a cluster does, so the trainer ignores records the killed run's rollouts left in
etcd until their leases expire), sandbox/ (the codeExec sandbox servers' sockets,
`tandem.cli.local_sandbox`). hostPath volumes become path rewrites (`tandem.cli.volumes`).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import secrets
import shutil
import signal
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import aetcd
import yaml
from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from tandem.checkpoint_engine.etcd import keys
from tandem.checkpoint_engine.etcd.local_etcd import LocalEtcd, free_port
from tandem.cli import local_sandbox, plot, progress_lines, say
from tandem.cli.local_procs import LocalContainer, containers_of, pod_cpus, stop_all
from tandem.cli.supervise import RolloutRestarts, diagnosis
from tandem.operator.manifests import builders, job_objects
from tandem.sidecars.rollout_engine.engine import CPU_RESERVED_ENV
from tandem.spec.models import RLHFJob
from tandem.spec.podenv import PodEnv
from tandem.spec.progress import Progress

console = say.console(stderr=True)


class _Stop(Exception):
    pass


def _job_uid(run_dir: Path, resume: bool) -> str:
    """The run's stand-in for metadata.uid: new per fresh run, kept by --resume (durable checkpoints)."""
    f = run_dir / "job-uid"
    if resume and f.exists():
        return f.read_text().strip()
    uid = f"local-{secrets.token_hex(6)}"
    f.write_text(uid)
    return uid


def _generation(run_dir: Path, resume: bool) -> int:
    """0 for a fresh run; one more than the previous run's for --resume (`TANDEM_RESTART_GENERATION`)."""
    f = run_dir / "generation"
    previous = int(f.read_text()) if resume and f.exists() else -1
    f.write_text(str(previous + 1))
    return previous + 1


def shm_root_of(job: RLHFJob) -> Path:
    return Path("/dev/shm") / f"tandem-{job.metadata.namespace}-{job.metadata.name}"


class AlreadyRunning(RuntimeError):
    """Another `tandem run` of the same namespace/name is running on this machine."""


@contextlib.contextmanager
def exclusive(job: RLHFJob) -> Any:
    """Hold the job's lock (a file beside its shared-memory root) for the run: two runs of one namespace/name
    would share that root, and each one's start or end would delete the other's versions under it. Raises
    AlreadyRunning, naming the holder's pid, when another run holds it; the kernel drops the lock when the
    holder exits, even on kill -9. The file is removed at the end (a taker that locked the removed file sees
    that its inode is no longer the path's and takes the new one)."""
    path = shm_root_of(job).with_name(shm_root_of(job).name + ".lock")
    while True:
        fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise AlreadyRunning(f"job {job.metadata.namespace}/{job.metadata.name} is already running on this "
                                 f"machine (tandem run pid {holder} holds {path}): wait for it, or give this one "
                                 f"another metadata.name") from None
        try:
            current = os.stat(path).st_ino
        except FileNotFoundError:
            current = -1
        if current == os.fstat(fd).st_ino:
            break
        os.close(fd)  # locked a file its holder removed on the way out: take the path's own
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        os.close(fd)  # closing the descriptor releases the lock


def processes_for(pods: list[dict[str, Any]], job: RLHFJob, run_dir: Path, etcd_endpoint: str, *, token: str,
                  shm_root: Path, extra: dict[str, str] | None = None) -> list[LocalContainer]:
    """The containers of `pods` (manifests from the builders or the API server) as local processes.

    What a kubelet would provide becomes local: the job file (the ConfigMap) under `run_dir`, the
    token (the Secret), a shm directory per pod (the emptyDir), free ports, 127.0.0.1 for pod
    addresses. Everything else comes from the manifests' env, plus `extra`.
    """
    job_file = run_dir / "job.yaml"
    job_file.write_text(yaml.safe_dump(job.model_dump(mode="json", by_alias=True, exclude_none=True),
                                       sort_keys=False))
    master_port = free_port()
    ports: dict[tuple[str, str], int] = {}

    def overrides(pod: str, container: str) -> dict[str, str]:
        port = ports.setdefault((pod, container), free_port())
        return {
            **PodEnv.environ(job_file=job_file, etcd_endpoints=etcd_endpoint, shm_dir=shm_root / pod, port=port,
                             pod_ip="127.0.0.1", master_addr="127.0.0.1", master_port=master_port, token=token,
                             output_dir=run_dir, shard_port=ports.setdefault((pod, "shard-server"), free_port())),
            "OMP_NUM_THREADS": "1",  # measured: 1.07 s/iteration vs 2.12 s without (sidecars share 2 cores)
            **(extra or {}),
        }

    out: list[LocalContainer] = []
    for pod in pods:
        own = {(job_objects.token_secret_name(job.metadata.name), job_objects.TOKEN_KEY): token}
        out += containers_of(pod, overrides=overrides, secrets=own, logs=run_dir / "logs")
    out = local_sandbox.rewire(out, run_dir)  # codeExec sandbox servers: a local socket, an env of their own
    for c in out:  # one machine: every process sees the same GPUs, no file of the trainer's to wait for
        c.env.pop(PodEnv.var("gpu_ids_file"), None)
    return sorted(out, key=lambda c: c.name != "rollout")  # rollouts first: the driver waits for them


def _prepare(job: RLHFJob, run_dir: Path, etcd: LocalEtcd, resume: bool, pin_pods: bool) -> list[LocalContainer]:
    extra = PodEnv.environ(resume=resume, job_uid=_job_uid(run_dir, resume))
    local = job.model_copy(update={"metadata": job.metadata.model_copy(update={"labels": {}})})  # no Kueue here
    pods = builders.build_pods(local, restart_generation=_generation(run_dir, resume))
    containers = processes_for(pods, job, run_dir, etcd.endpoint, token=secrets.token_hex(16),
                               shm_root=shm_root_of(job), extra=extra)
    if (note := local_sandbox.isolation_note(containers)) is not None:
        console.print(say.styled(note, "yellow"))
    pods_here = sorted({c.pod for c in containers})
    if pin_pods:
        share = pod_cpus(pods_here, sorted(os.sched_getaffinity(0)))
        for c in containers:
            c.cpus = share[c.pod]
        console.print("pods pinned: " + ", ".join(f"{pod} cores {sorted(cpus)}" for pod, cpus in share.items()),
                      markup=False)
    elif len(pods_here) > 1:  # pods share every core: no vLLM may take them all (sidecars/rollout/cores.py)
        for c in containers:
            c.env.setdefault(CPU_RESERVED_ENV, "1")  # vLLM's default reservation
    return containers


def _table(job: RLHFJob, p: Progress | None, started: float, containers: list[LocalContainer]) -> Table:
    t = Table(title=f"RLHFJob {job.metadata.name} ({job.spec.algorithm.name}) — {time.monotonic() - started:.0f}s",
              show_header=True, header_style="bold")
    env = job.spec.rollout.environment
    turns = env is not None and env.type != "single"  # multi-turn: turns and tool calls per trajectory
    for col in ("phase", "iteration", "version", "reward", "eval pass@1", "kl", "sync s") + (
            ("turns", "tool calls") if turns else ()):
        t.add_column(col)
    if p is None:
        t.add_row("starting", *["-"] * (8 if turns else 6))
    else:
        def f(x: float | None, fmt: str = ".3f") -> str:
            return "-" if x is None else format(x, fmt)
        ev = "-" if p.eval is None else f"{p.eval.pass_at_1:.3f} @{p.eval.iteration}"
        t.add_row(p.phase, f"{p.iteration}/{p.iterations}", str(p.weight_version), f(p.reward_mean), ev,
                  f(p.kl, ".4f"), f(p.last_sync_seconds, ".2f"),
                  *((f(p.turns_mean, ".2f"), f(p.tool_calls_mean, ".2f")) if turns else ()))
    t.caption = "  ".join(f"{c.label}: {'up' if c.exit_code() is None else 'exit ' + str(c.exit_code())}"
                          + (f" (restarted {c.restarts})" if c.restarts else "") for c in containers)
    if p is not None and p.message and p.phase not in ("done", "failed"):
        t.caption += f"\n{p.message}"  # e.g. the driver waiting for a healthy rollout, or paused by its guard
    if p is not None and p.guard and p.phase not in ("paused", "done", "failed"):
        t.caption += f"\n{p.guard}"  # algorithm.mismatchGuard's warning
    return t


def _display(out: Console, job: RLHFJob, run_dir: Path, containers: list[LocalContainer], *, started: float,
             since: float) -> tuple[AbstractContextManager[Any], Callable[[Progress | None], None]]:
    """What shows the run on `out`, and its update: the live table on a terminal, else plain lines."""
    if progress_lines.interactive(out):
        live = Live(_table(job, None, started, containers), console=out, refresh_per_second=2)
        return live, lambda p: live.update(_table(job, p, started, containers))
    lines = progress_lines.PlainLines(run_dir, job.spec.algorithm.iterations, since=since,
                                      emit=lambda line: out.print(line, markup=False, highlight=False))
    return contextlib.nullcontext(), lines.update


async def _follow(job: RLHFJob, etcd: LocalEtcd, containers: list[LocalContainer], run_dir: Path) -> Progress | None:
    """Follow the driver's record until the run ends: the live table on a terminal, else one line per iteration."""
    uid = next((c.env[PodEnv.var("job_uid")] for c in containers if PodEnv.var("job_uid") in c.env), "local")
    key = keys.progress(job.metadata.namespace, keys.scope(job.metadata.name, uid)).encode()
    trainers = [c for c in containers if c.name == "trainer"]
    started, since = time.monotonic(), time.time()
    last: Progress | None = None
    restarts = RolloutRestarts(console)
    client = aetcd.Client(etcd.host, etcd.port)
    display, show = _display(console, job, run_dir, containers, started=started, since=since)
    try:
        with display:
            while True:
                got = await client.get(key)
                if got is not None:
                    last = Progress.from_json(got.value)
                show(last)
                # a resumed run's record says "done" until its driver writes: only this run's count
                if last is not None and last.phase in ("done", "failed") and last.updated_at >= since:
                    return last
                dead = [c for c in containers if c.exit_code() not in (None, 0) and not restarts.restart(c)]
                if dead or (trainers and all(c.exit_code() == 0 for c in trainers)):
                    return last
                await asyncio.sleep(0.5)
    finally:
        await client.close()


def _plot(run_dir: Path, title: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]], Path] | None:
    """The run's metrics rows, its evaluations and progress.png drawn from them; None without metrics."""
    metrics = run_dir / "metrics.jsonl"
    if not metrics.exists() or not metrics.stat().st_size:
        return None
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    evals_file = run_dir / "eval.jsonl"
    evals = [json.loads(line) for line in evals_file.read_text().splitlines() if line.strip()] \
        if evals_file.exists() else []
    return rows, evals, plot.plot_metrics(rows, run_dir / "progress.png", title=title, evals=evals)


def run_job(job: RLHFJob, *, workdir: Path, resume: bool = False, keep_etcd: bool = False,
            pin_pods: bool = False) -> int:
    """Run to completion; returns the process exit code (0: the driver reported done).

    `pin_pods` gives each pod its own share of this machine's cores (`local_procs.pod_cpus`), as pods on
    separate nodes have: what overlapping generation with training gains shows only then."""
    try:
        with exclusive(job):
            return _run_locked(job, workdir=workdir, resume=resume, keep_etcd=keep_etcd, pin_pods=pin_pods)
    except AlreadyRunning as e:
        console.print(say.styled(str(e), "red"), markup=False, highlight=False)
        return 1


def _run_locked(job: RLHFJob, *, workdir: Path, resume: bool, keep_etcd: bool, pin_pods: bool) -> int:
    run_dir = (workdir / job.metadata.name).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    etcd_dir = run_dir / "etcd"
    if not resume:
        shutil.rmtree(etcd_dir, ignore_errors=True)
        for name in ("metrics.jsonl", "eval.jsonl"):
            (run_dir / name).unlink(missing_ok=True)
        shutil.rmtree(run_dir / "tensorboard", ignore_errors=True)
        # a fresh run's pods start with empty shared memory, as new pods' emptyDirs do: an earlier
        # --keep-etcd run's versions there would clash with this run's version numbers
        shutil.rmtree(shm_root_of(job), ignore_errors=True)
    etcd = LocalEtcd(etcd_dir / "data").start()
    containers: list[LocalContainer] = []
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

    def on_term(*_: object) -> None:
        raise KeyboardInterrupt

    # our own handler for Ctrl-C too: asyncio's default one only cancels the follow task, and a
    # cancellation that lands inside the etcd client's await can be swallowed (the run went on)
    for sig in previous:
        signal.signal(sig, on_term)
    result: Progress | None = None
    plotting: Future[tuple[list[dict[str, Any]], list[dict[str, Any]], Path] | None] | None = None
    try:
        containers = _prepare(job, run_dir, etcd, resume, pin_pods)
        console.print(Text.assemble(("tandem run", "bold"), f" {job.metadata.name}: {len(containers)} processes, "
                                    f"etcd {etcd.endpoint}, logs in {run_dir / 'logs'}"))
        for c in containers:
            c.start()
        result = asyncio.run(_follow(job, etcd, containers, run_dir))
        if result is not None and result.phase == "done":  # the rows are final: plot while the sidecars stop
            pool = ThreadPoolExecutor(1, thread_name_prefix="plot")
            plotting = pool.submit(_plot, run_dir, job.metadata.name)
            pool.shutdown(wait=False)
    except KeyboardInterrupt:
        console.print(say.styled("interrupted: stopping sidecars", "yellow"))
    finally:
        try:
            killed = stop_all(containers, grace=30.0)  # vLLM takes a while to shut down on a busy machine
            if killed:
                console.print(say.styled(f"killed after 30 s: {', '.join(killed)}", "yellow"))
        except RuntimeError as e:
            console.print(say.styled(str(e), "red"))
        etcd.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if not keep_etcd:
            shutil.rmtree(etcd_dir, ignore_errors=True)
            shutil.rmtree(shm_root_of(job), ignore_errors=True)
    ok = result is not None and result.phase == "done"
    for c in containers:
        if c.exit_code() not in (0, None, -signal.SIGTERM, 128 + signal.SIGTERM) or not ok:
            console.print(say.styled(f"--- {c.label} (exit {c.exit_code()}), last lines of {c.log_path}:", "dim"))
            console.print(c.tail(15), markup=False, highlight=False)
    plotted = plotting.result() if plotting is not None else _plot(run_dir, job.metadata.name)
    if plotted is not None:
        rows, evals, png = plotted
        console.print(f"metrics: {run_dir / 'metrics.jsonl'}  plot: {png}", markup=False)
        plot.print_summary(rows, console, evals)
    state = result.phase if result else "no progress"
    if ok:
        console.print("[green]done[/green]")
    else:
        console.print(Text.assemble(("job did not finish", "red"), f" ({state}): "), end="")
        console.print(diagnosis(result, containers), markup=False, highlight=False)
    return 0 if ok else 1
