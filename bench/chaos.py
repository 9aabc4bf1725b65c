"""Chaos benchmark: a job whose rollout engines are killed and hung, against the same job undisturbed.

The toy job (examples/tiny-grpo.yaml's task: the toy Qwen2 built by `python -m tandem.sidecars.toy`) on one
hybrid pod and two rollout-only pods, run by `tandem run` twice with the same spec.seed: undisturbed, then
disturbed by `Chaos`: every `--kill-every` iterations kill -9 of a rollout-only pod's vLLM engine core (its
sidecar restarts the engine; the driver re-sends what it had not finished), none in the last `--kill-every`
iterations so that the last killed engine can come back within the run, and once a stop (SIGSTOP) of the
other rollout-only pod's engine for `--hang-seconds` (a hung GPU: its sidecar kills it at the deadline its
recent steps set, at most failurePolicy.rolloutStallSeconds). Each pair of runs once per `--modes`: cold (a
restart starts vLLM anew) and spare (rollout.spareEngine: a restart adopts the spare started ahead). Reported
per mode: iterations completed, wall time of each run and their ratio, reward per iteration side by side, the
engines that failed, restarted (seconds each, spares taken) and served again, rollouts dropped and re-admitted,
prompts re-sent, the seconds until the hung engine was cut and the longest recovery (failure to first
generation). Target (issue): every iteration completes with no restart of the job, every failed engine serves
again within the run, and the disturbed run takes at most 1.25x the undisturbed one. `python bench/chaos.py
--help`.

Measured 2026-11-29 on 2 cores (alone), `--iterations 30` (kills at iterations 10 and 20, the hang at 10; results
in bench/results/chaos.json): every iteration completed in all four runs, no job restart.
- cold: calm 182 s, disturbed 159 s (0.87x: with engines out, the rest share the 2 cores); of 3 engines that
  failed, 1 restarted (16.2 s) and served again within the run; pod 1's second cold restart was still starting
  when the run ended, and pod 2's (after its hang was cut at 23.5 s) failed as its worker process died during
  start, silently in its log (the supervisor would have tried again after its backoff). Not every engine back.
- spare (rollout.spareEngine): calm 216 s (the three spares' starts share the cores with the job: +19% over cold's
  calm), disturbed 248 s: 1.15x; 3 engines failed, 3 restarted by adopting their spares in 0.1, 0.1 and 2.8 s, 3
  served again; hang cut at 24.9 s (the ceiling, 20 s, set its deadline); longest recovery, failure to first
  generation, 26.6 s (the rollout waits for the driver's next iteration to be re-admitted). Target met.

`Chaos` is also the injector of tests/e2e/test_rollout_faults.py: it finds a rollout sidecar by its pod's
environment (TANDEM_POD) under a run directory, its vLLM engine core and workers as its children (their
titles say VLLM::EngineCore / VLLM::Worker; their environ no longer shows the pod's variables), and reads
the sidecar's GET /health (busy: the call into vLLM now open; restarts). Each of its waits ends at WAIT_S or at
the injector's `deadline` (a test's: inside its pytest timeout), whichever is sooner, with a TimeoutError naming
what it waited for; `wait_run` waits for the run itself the same way.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import yaml

ROOT = Path(__file__).resolve().parents[1]
ROOTS = ("operator", "sidecars", "spec", "checkpoint_engine")
WAIT_S = 600.0


def wait_run(proc: subprocess.Popen[Any], seconds: float, failures: list[BaseException], what: str) -> None:
    """Wait until `proc` ends; return early once `failures` holds one (the injector's, which names its wait);
    TimeoutError naming `what` when it runs past `seconds`."""
    end = time.monotonic() + seconds
    while not failures:
        try:
            proc.wait(timeout=max(0.0, min(0.5, end - time.monotonic())))
            return
        except subprocess.TimeoutExpired:
            if time.monotonic() >= end:
                raise TimeoutError(f"{what} did not end within {seconds:.0f}s") from None


class Chaos:
    def __init__(self, run_dir: Path, job: str, deadline: float | None = None) -> None:
        """`deadline`: a time.monotonic() value no wait of the injector goes past (None: WAIT_S each)."""
        self.run_dir, self.job, self.deadline = run_dir, job, deadline
        self.log: list[str] = []
        self.stopped_at: dict[str, float] = {}  # pod -> wall time of its engine's SIGSTOP (hang)
        self.cut_s: dict[str, float] = {}  # pod -> seconds from that SIGSTOP until its engine was gone (killed)

    # ---- what the run did ------------------------------------------------------------------
    def rows(self) -> list[dict[str, Any]]:
        path = self.run_dir / "metrics.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def wait_rows(self, n: int, stop: threading.Event) -> None:
        self._until(lambda: len(self.rows()) >= n, stop, f"{n} iterations")

    # ---- finding a rollout's processes -----------------------------------------------------------
    def sidecar(self, pod: str) -> psutil.Process:
        mark = f"TANDEM_POD={pod}".encode()
        for p in psutil.process_iter(["cmdline"]):
            try:
                if "tandem.sidecars.rollout" in " ".join(p.info["cmdline"] or []) and \
                        mark in Path(f"/proc/{p.pid}/environ").read_bytes().split(b"\0"):
                    return p
            except (OSError, psutil.Error):
                continue
        raise LookupError(f"no rollout sidecar of pod {pod}")

    def engine(self, pod: str) -> tuple[psutil.Process | None, list[psutil.Process]]:
        """(vLLM's engine core, it and its workers) serving under pod's rollout sidecar: the processes its /health
        names (a spare engine, rollout.spareEngine, runs beside them), else every vLLM process under it."""
        sidecar = self.sidecar(pod)
        named = set((self.health(pod) or {}).get("pids") or ())
        procs = []
        for p in sidecar.children(recursive=True):
            try:
                title = " ".join(p.cmdline()) + " " + p.name()
            except psutil.Error:
                continue
            if "VLLM" in title and p.status() != psutil.STATUS_ZOMBIE and (not named or p.pid in named):
                procs.append(p)
        core = next((p for p in procs if "EngineCore" in " ".join(p.cmdline()) + p.name()), None)
        return core, procs

    def health(self, pod: str) -> dict[str, Any] | None:
        env = dict(kv.split(b"=", 1) for kv in Path(f"/proc/{self.sidecar(pod).pid}/environ").read_bytes()
                   .split(b"\0") if b"=" in kv)
        try:
            out: dict[str, Any] = httpx.get(f"http://127.0.0.1:{int(env[b'TANDEM_CE_PORT'])}/health", timeout=5).json()
            return out
        except (httpx.HTTPError, ValueError):
            return None

    # ---- faults -----------------------------------------------------------------------------------
    def kill(self, pod: str) -> str:
        """kill -9 of the engine core (its worker is orphaned, as an OOM kill leaves it)."""
        core, _ = self.engine(pod)
        if core is None:
            return "no engine"
        core.send_signal(signal.SIGKILL)
        self._say(f"kill -9 {pod} engine core {core.pid}")
        return "killed"

    def stop_then_kill(self, pod: str, stop: threading.Event) -> str:
        """SIGSTOP the engine, wait until a call into it is open (the driver's next update or generate),
        kill -9 its engine core: killed mid-call. Returns the call (`busy`)."""
        core, procs = self._wait_engine(pod, stop)
        for p in procs:
            p.send_signal(signal.SIGSTOP)
        busy: list[str] = []

        def open_call() -> bool:
            h = self.health(pod)
            if h and h.get("busy"):
                busy.append(str(h["busy"]))
            return bool(busy)

        self._until(open_call, stop, f"a call into {pod}'s stopped engine", poll=0.05)
        core.send_signal(signal.SIGKILL)
        self._say(f"{pod}: engine stopped, kill -9 of its core {core.pid} during its {busy[0]}")
        return busy[0]

    def kill_mid_step(self, pod: str, stop: threading.Event) -> str:
        """kill -9 of the engine core while a generation step is open (polled every 10 ms)."""
        core, _ = self._wait_engine(pod, stop)
        self._until(lambda: (self.health(pod) or {}).get("busy") == "step", stop, f"{pod} generating", poll=0.01)
        core.send_signal(signal.SIGKILL)
        self._say(f"{pod}: kill -9 of its engine core {core.pid} mid-generate")
        return "step"

    def hang(self, pod: str, seconds: float, stop: threading.Event, during: str | None = None,
             paced_below: float | None = None) -> str:
        """SIGSTOP the engine core and workers for `seconds` (or until they are gone: killed as hung); with
        `during`, once that call is open (/health's busy, polled every 10 ms); with `paced_below`, only once the
        engine's deadline for it is set by its pace (/health's stallDeadlineS below that ceiling: past its
        warm-up calls). The seconds until they were gone go to `cut_s[pod]`."""
        _, procs = self._wait_engine(pod, stop)
        while True:
            if self.deadline is not None and time.monotonic() > self.deadline:
                raise TimeoutError(f"no stop of {pod}'s engine during its {during} before the deadline")
            if during is not None:
                self._until(lambda: _open(self.health(pod), during, paced_below), stop, f"{pod}'s {during}"
                            + (f" with a deadline below {paced_below:.0f}s" if paced_below is not None else ""),
                            poll=0.01)
            for p in procs:
                p.send_signal(signal.SIGSTOP)
            t, self.stopped_at[pod] = time.monotonic(), time.time()
            seen = self.health(pod) or {}
            if during is None or seen.get("busy") == during:  # that call is open on the stopped engine
                break
            for p in procs:  # it returned before the stop, and no other call of that kind followed: again
                p.send_signal(signal.SIGCONT)
        self._say(f"{pod}: engine stopped (SIGSTOP) for up to {seconds:.0f}s during its {seen.get('busy')} "
                  f"(deadline {seen.get('stallDeadlineS')}s: {seen.get('stallDeadline')})")
        deadline = t + seconds if self.deadline is None else min(t + seconds, self.deadline)
        said = t
        while time.monotonic() < deadline and not stop.is_set() and any(_alive(p) for p in procs):
            time.sleep(0.05)
            if time.monotonic() - said > 10:  # how its sidecar sees it meanwhile
                said, h = time.monotonic(), self.health(pod) or {}
                self._say(f"{pod}: stopped {said - t:.0f}s, /health busy {h.get('busy')} stalled "
                          f"{h.get('stalledS')}s of {h.get('stallDeadlineS')}s")
        if not any(_alive(p) for p in procs):
            self.cut_s[pod] = time.monotonic() - t
            self._say(f"{pod}: its stopped engine was killed after {self.cut_s[pod]:.1f}s")
        for p in procs:
            if _alive(p):
                p.send_signal(signal.SIGCONT)
        return "hung"

    def wait_restarted(self, pod: str, restarts: int, stop: threading.Event) -> None:
        self._until(lambda: (h := self.health(pod)) is not None and h.get("ok") and h.get("restarts", 0) >= restarts,
                    stop, f"{pod}'s engine restarted {restarts} times")

    def _wait_engine(self, pod: str, stop: threading.Event) -> tuple[psutil.Process, list[psutil.Process]]:
        found: list[tuple[psutil.Process, list[psutil.Process]]] = []

        def ready() -> bool:
            h = self.health(pod)
            core, procs = self.engine(pod)
            if h and h.get("ok") and core is not None:
                found.append((core, procs))
            return bool(found)

        self._until(ready, stop, f"{pod}'s engine serving")
        return found[0]

    def _until(self, cond: Any, stop: threading.Event, what: str, poll: float = 0.2) -> None:
        start = time.monotonic()
        deadline = start + WAIT_S if self.deadline is None else min(start + WAIT_S, self.deadline)
        while not cond():
            if stop.is_set():
                raise RuntimeError(f"the run ended before {what}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {what} within {time.monotonic() - start:.0f}s")
            stop.wait(poll)

    def _say(self, line: str) -> None:
        self.log.append(f"{time.strftime('%H:%M:%S')} {line}")
        print(f"[chaos] {line}", flush=True)


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


# ---- the benchmark -------------------------------------------------------------------------------------
def job_file(toy: Path, out: Path, name: str, iterations: int, stall: int, spare: bool = False) -> Path:
    job: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "tiny-grpo.yaml").read_text())
    job["metadata"]["name"] = name
    job["spec"]["model"]["path"] = str(toy / "model")
    job["spec"]["dataset"]["path"] = str(toy / "train.jsonl")
    job["spec"]["algorithm"]["iterations"] = iterations
    job["spec"]["rolloutOnlyReplicas"] = 2
    job["spec"]["seed"] = 1
    job["spec"]["failurePolicy"].update(rolloutStallSeconds=stall)
    job["spec"]["rollout"]["spareEngine"] = spare
    path = out / f"{name}.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def run(job: Path, workdir: Path, name: str, disturb: Any = None) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(ROOT / r) for r in ROOTS)}
    shutil.rmtree(workdir / name, ignore_errors=True)  # a new run: no rows, logs or state of an earlier one
    t = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "tandem.cli.main", "run", str(job), "--workdir", str(workdir)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    done = threading.Event()
    chaos = Chaos(workdir / name, name)
    thread = None
    if disturb is not None:
        thread = threading.Thread(target=disturb, args=(chaos, done), daemon=True)
        thread.start()
    rc = proc.wait()
    done.set()
    if thread is not None:
        thread.join(30)
    rows = chaos.rows()
    logs = workdir / name / "logs"
    texts = [p.read_text() for p in logs.glob("*-rollout.log")]
    restart_s = sorted(float(x) for t in texts for x in re.findall(r"vLLM engine restarted in ([0-9.]+)s", t))
    spares = sum(t.count("the spare taken") for t in texts)
    served_again = sum(t.count("recovered: a generation completed") for t in texts)
    failures = sum(t.count("vLLM engine failed (") for t in texts)
    return {"rc": rc, "seconds": time.monotonic() - t, "iterations": len(rows),
            "reward": [r["reward_mean"] for r in rows], "restarts": len(restart_s),
            "restart_s": restart_s, "spares_taken": spares, "failures": failures, "served_again": served_again,
            "dropped": sum(r.get("rollouts_dropped", 0) for r in rows),
            "rejoined": sum(r.get("rollouts_rejoined", 0) for r in rows),
            "resent": sum(r.get("prompts_resent", 0) for r in rows), "faults": chaos.log,
            "hang_cut_s": chaos.cut_s, "recovery_s": max((r.get("rollout_recovery_s", 0) for r in rows), default=0)}


def disturber(name: str, kill_every: int, hang_s: float, last: int) -> Any:
    """Kill pod 1's engine every `kill_every` iterations up to iteration `last` (so that the last killed engine has
    time to come back within the run), and hang pod 2's once, at the first kill."""
    def disturb(chaos: Chaos, done: threading.Event) -> None:
        try:
            n, hung = kill_every, False
            while not done.is_set() and n <= last:
                chaos.wait_rows(n, done)
                chaos.kill(f"{name}-1")
                if not hung:
                    hung = True
                    threading.Thread(target=chaos.hang, args=(f"{name}-2", hang_s, done), daemon=True).start()
                n += kill_every
        except (RuntimeError, LookupError) as e:
            print(f"[chaos] injector stopped: {e}", flush=True)  # the run ended (or a pod was not found)

    return disturb


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iterations", type=int, default=40)
    ap.add_argument("--kill-every", type=int, default=10, help="iterations between two kills (none in the last "
                    "kill-every iterations: the last killed engine comes back within the run)")
    ap.add_argument("--hang-seconds", type=float, default=60.0)
    ap.add_argument("--stall-seconds", type=int, default=20, help="failurePolicy.rolloutStallSeconds")
    ap.add_argument("--modes", nargs="+", choices=("cold", "spare"), default=["cold", "spare"],
                    help="cold: a killed engine restarts with a new vLLM; spare: rollout.spareEngine (each mode: a "
                    "calm and a disturbed run)")
    ap.add_argument("--dir", type=Path, default=Path.home() / ".cache" / "tandem" / "bench" / "chaos")
    args = ap.parse_args(argv)
    args.dir.mkdir(parents=True, exist_ok=True)
    sys.path[:0] = [str(ROOT / r) for r in ROOTS]
    from tandem.sidecars.toy.build import build_toy

    toy = build_toy(args.dir / "toy", seed=0, warmup_steps=40, max_operand=10).root
    results: dict[str, dict[str, Any]] = {}
    ok = True
    for mode in args.modes:  # cold: a restart starts vLLM anew; spare: rollout.spareEngine
        calm_name, hit_name = f"chaos-calm-{mode}", f"chaos-faults-{mode}"
        for name, disturb in ((calm_name, None),
                              (hit_name, disturber(hit_name, args.kill_every, args.hang_seconds,
                                                   args.iterations - args.kill_every))):
            job = job_file(toy, args.dir, name, args.iterations, args.stall_seconds, spare=mode == "spare")
            print(f"running {name} ...", flush=True)
            results[name] = run(job, args.dir / "runs", name, disturb)
            print(json.dumps({k: v for k, v in results[name].items() if k != "reward"}), flush=True)
        ok = report(mode, results[calm_name], results[hit_name], args.iterations) and ok
    (args.dir / "chaos.json").write_text(json.dumps(results, indent=1))
    return 0 if ok else 1


def report(mode: str, calm: dict[str, Any], hit: dict[str, Any], iterations: int) -> bool:
    print(f"\n== {mode}: iterations: calm {calm['iterations']}/{iterations} (rc {calm['rc']}), "
          f"disturbed {hit['iterations']}/{iterations} (rc {hit['rc']})")
    ratio = hit["seconds"] / calm["seconds"]
    print(f"wall: calm {calm['seconds']:.0f}s, disturbed {hit['seconds']:.0f}s, ratio {ratio:.2f}x (target <= 1.25x)")
    print(f"disturbed: engines failed {hit['failures']}, restarted {hit['restarts']} (seconds each: "
          f"{hit['restart_s']}; the spare taken {hit['spares_taken']}), served again {hit['served_again']} "
          f"(every engine back: {'yes' if hit['served_again'] == hit['failures'] else 'no'}); "
          f"rollouts dropped {hit['dropped']}, re-admitted {hit['rejoined']}, prompts "
          f"re-sent {hit['resent']}; hang cut after {hit['hang_cut_s']} s, longest recovery {hit['recovery_s']} s")
    print("reward per iteration (calm | disturbed):")
    for i, (a, b) in enumerate(zip(calm["reward"], hit["reward"], strict=False)):
        print(f"  {i:3d}  {a:.3f} | {b:.3f}")
    return bool(hit["iterations"] == iterations and hit["rc"] == 0 and hit["served_again"] == hit["failures"])


if __name__ == "__main__":
    sys.exit(main())


def _open(health: dict[str, Any] | None, during: str, paced_below: float | None) -> bool:
    """The call `during` is open on the engine (and, with `paced_below`, judged by a deadline below it)."""
    h = health or {}
    return h.get("busy") == during and (paced_below is None or float(h.get("stallDeadlineS") or paced_below)
                                        < paced_below)
