"""RolloutEngine: owns one in-process vLLM `LLM` — dummy start, in-place update, generate, terminate.

Caller: the rollout sidecar (through routes.py and directly for /generate), tests and
bench/weight_sync.py. One engine per process; every public method is serialised by a lock.

The engine keeps vLLM's lifecycle (start, sleep, wake_up, terminate; vLLM's arguments and shutdown: llm.py),
generation (generation.py) and its status; what it serves is its weights' (`weights.EngineWeights`: resolve a
version, verify it, load it in place, serve LoRA adapters), which `update` and `update_from_path` call under
the engine's lock. A version missing from the pod's shm is its source's to fetch first (`VersionSource`, given
at construction: the rollout sidecar's pulls from other pods; the default, SHM_ONLY, fetches nothing).
Phases and operations are published in etcd (keys.engine/keys.op).
generate() refuses a prompt with no room for one generated token in max_model_len (`PromptTooLong`,
HTTP 400 naming the limit) before vLLM sees it, and any request vLLM itself refuses is a `BadRequest`:
neither leaves the engine FAILED.

vLLM's engine core and workers are recorded at start (procs.py); terminating the engine, or
finding it dead, waits until they are gone and unlinks the /dev/shm segments they leave behind.
Every step of vLLM's engine loop and every reload is timed (`step_watch.StepWatch`): a call open for too
long (its deadline follows the calls' recent durations: stall_deadline.py) is a hung engine, which `kill`
ends (SIGKILL to its processes, without the lock the hung call holds); the call then fails and the engine is
FAILED, naming the cause (failures.py: `EngineFailures`, which the engine derives from). Restarting a FAILED
engine is the rollout sidecar's supervisor's (`tandem.sidecars.rollout.supervisor`): `start` again, or `adopt` a
spare engine started ahead (spare.py, rollout.spareEngine); the first generation completed after it ends the
recovery it times (recovery.py).
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

from tandem.checkpoint_engine import errors
from tandem.checkpoint_engine.etcd.sync_registry import SyncRegistry
from tandem.checkpoint_engine.service.engine_status import EngineStatus, Phase, UpdateReport
from tandem.sidecars.rollout_engine import generation, llm, ops, routing
from tandem.sidecars.rollout_engine.config import (
    CPU_BIND_ENV,
    CPU_RESERVED_ENV,
    EXECUTE_TIMEOUT_S,
    EXTENSION,
    EngineConfig,
    cpu_threads_bind,
    cpu_worker_binding,
    expected_parameters,
    prepare_env,
)
from tandem.sidecars.rollout_engine.failures import EngineFailures
from tandem.sidecars.rollout_engine.procs import EngineProcesses
from tandem.sidecars.rollout_engine.recovery import Recovery
from tandem.sidecars.rollout_engine.sampling import Completion, SamplingOptions
from tandem.sidecars.rollout_engine.spare import SpareEngine
from tandem.sidecars.rollout_engine.step_watch import StepWatch
from tandem.sidecars.rollout_engine.version_source import SHM_ONLY, VersionSource
from tandem.sidecars.rollout_engine.weights import EngineWeights
from tandem.spec.trainer import image_token

log = logging.getLogger(__name__)
__all__ = ["CPU_BIND_ENV", "CPU_RESERVED_ENV", "EXECUTE_TIMEOUT_S", "EXTENSION", "EngineConfig", "RolloutEngine",
           "cpu_threads_bind", "cpu_worker_binding", "expected_parameters", "prepare_env"]


class RolloutEngine(EngineFailures):
    def __init__(self, config: EngineConfig, registry: SyncRegistry | None = None, role: str = "rollout",
                 source: VersionSource = SHM_ONLY) -> None:
        self.cfg, self.registry, self.role = config, registry, role
        self.source = source  # makes a version present in this pod's shm before it loads (version_source.py)
        self.llm: Any = None
        self.phase = Phase.STOPPED
        self.version: int | None = None
        self.model_dir: str | None = None
        self.dummy = False
        self.error: str | None = None
        self.timings: dict[str, float] = {}
        self._lock = threading.RLock()
        self._sleep_level = 0
        self.procs = EngineProcesses()
        self.weights = EngineWeights(self, registry)  # what vLLM serves: versions, in place; adapters
        self.watch = StepWatch()  # how long the call into vLLM now in progress has run, and may
        self.recovery = Recovery()  # from a failure found (the supervisor) to the first generation after it
        self.killed_for: str | None = None  # why `kill` ended the engine's processes (a hang)
        self.restarts = 0  # engines started again after a failure (the sidecar's supervisor counts)
        self.recovering = False  # the supervisor is starting it again: not ready (/health 503)
        self._routing = (0, 0)  # routing replay: (MoE layers, experts per token) recorded
        self.spare: SpareEngine | None = None  # rollout.spareEngine: started ahead, adopted by a restart (spare.py)

    @property
    def lora(self) -> Any:
        """The LoRARequest of the adapter version served (adapter versions only), else None."""
        return self.weights.lora

    # ---- lifecycle -----------------------------------------------------------------------------
    def start(self, model_dir: str, dummy: bool = True) -> dict[str, float]:
        with self._lock, self._op("start", model_dir=model_dir, dummy=dummy):
            self._starting()
            t0 = time.perf_counter()
            try:
                launched = llm.launch(self.cfg, model_dir, dummy)
            except Exception as e:
                self.set_phase(Phase.FAILED, error=f"start failed: {e}")
                raise
            return self._serve(launched, t0)

    def adopt(self, spare: llm.Launched) -> dict[str, float]:
        """Serve from an engine started ahead (spare.py) in place of a failed one: a restart without vLLM's cold
        start. What start does once vLLM is up; a version is loaded next, as after start."""
        with self._lock, self._op("start", model_dir=spare.model_dir, dummy=spare.dummy, spare=True):
            self._starting()
            return self._serve(spare, time.perf_counter())

    def _starting(self) -> None:
        if self.phase not in (Phase.STOPPED, Phase.FAILED):
            raise errors.WrongPhase(f"start needs a stopped engine; it is {self.phase.value}")
        if self.llm is not None:
            self._destroy()
        self.set_phase(Phase.STARTING)

    def _serve(self, launched: llm.Launched, t0: float) -> dict[str, float]:
        """Serve from a started vLLM: its step and reload calls timed, routing capture, the parameters expected."""
        self.llm, self.procs = launched.llm, launched.procs
        try:
            self.watch.wrap(self.llm.llm_engine)
            self.killed_for = None
            if self.cfg.routing_replay:
                bound = routing.start_capture(self.llm)
                self._routing = (int(bound["layers"]), int(bound["topk"]))
            self.weights.expect(launched.model_dir,
                                str(self.llm.llm_engine.model_config.dtype).removeprefix("torch."))
        except Exception as e:
            self._destroy()
            self.set_phase(Phase.FAILED, error=f"start failed: {e}")
            raise
        self.model_dir, self.dummy, self.version, self.weights.lora = launched.model_dir, launched.dummy, None, None
        self.timings.update({"start_s": launched.start_s, "start_total_s": time.perf_counter() - t0})
        self.set_phase(Phase.READY)
        return {k: self.timings[k] for k in ("start_s", "start_total_s")}

    @staticmethod
    def _on_gpu() -> bool:
        return llm.on_gpu()

    def _enforce_eager(self) -> bool:
        return llm.enforce_eager(self.cfg)

    def terminate(self) -> dict[str, float]:
        """Destroy the LLM and free its memory (accelerator memory included); idempotent."""
        with self._lock, self._op("terminate"):
            t0 = time.perf_counter()
            self.set_phase(Phase.TERMINATING)
            self._destroy()
            self.version, self.weights.lora = None, None
            self.timings["terminate_s"] = time.perf_counter() - t0
            self.set_phase(Phase.STOPPED)
            return {"terminate_s": self.timings["terminate_s"]}

    def _destroy(self) -> None:
        vllm_llm, self.llm = self.llm, None
        self.weights.discard_adapter()  # the served adapter's PEFT directory in shm
        self.procs.refresh()  # workers and segments made since start, while they are still mapped
        if self.procs.any_dead():  # a dead engine has nothing to shut down in order: the rest of it goes at once
            self.procs.kill()
        if vllm_llm is not None:
            llm.shutdown(vllm_llm, self.cfg.shutdown_timeout_s)
            del vllm_llm
        gc.collect()
        removed = self.procs.reap(grace_s=self.cfg.shutdown_timeout_s)
        if removed:
            log.info("removed %d shared-memory segments vLLM left: %s", len(removed), ", ".join(removed))
        llm.empty_cache()

    def sleep(self, level: int = 1) -> None:
        """Free accelerator memory but keep the process; level 2 also drops the weights (an update
        is needed after wake_up). vLLM's CPU worker ignores both levels."""
        with self._lock, self._op("sleep", level=level):
            self._need(Phase.READY)
            self.llm.sleep(level=level)
            self._sleep_level = level
            self.set_phase(Phase.SLEEPING)

    def wake_up(self) -> None:
        with self._lock, self._op("wake_up"):
            self._need(Phase.SLEEPING)
            self.llm.wake_up()
            if self._sleep_level == 2 and self.cfg.enable_sleep_mode:
                self.version = None  # the weights were discarded: load a version next
            self.set_phase(Phase.READY)

    # ---- weights (weights.py) ---------------------------------------------------------------------
    def update(self, version: int | None = None) -> UpdateReport:
        """Load version `version` (default: the latest registered) from shared memory, once the engine's
        source made it present there (outside the lock: generation goes on while shards arrive)."""
        if self.source is not SHM_ONLY:
            self._need(Phase.READY)  # a failed or restarting engine pulls nothing (the supervisor loads the latest)
            version = self.source.present(version)
        with self._lock, self._op("update", version=version):
            if self.registry is None:
                raise errors.UnsupportedOperation("update by version needs an etcd registry")
            self._need(Phase.READY)
            return self.weights.update(version)

    def update_from_path(self, path: str | Path) -> UpdateReport:
        """Load a version directory directly (no etcd): same validation, same load."""
        with self._lock, self._op("update_from_path", path=str(path)):
            self._need(Phase.READY)
            return self.weights.update_from_path(path)

    # ---- generation (generation.py) ---------------------------------------------------------------
    def generate(
        self,
        prompts: Sequence[str | Sequence[int]],
        options: SamplingOptions | None = None,
        n: int = 1,
        max_tokens: Sequence[int] | None = None,
        images: Sequence[Sequence[Any]] | None = None,
    ) -> list[list[Completion]]:
        """n completions per prompt, with token ids and the log-prob of every sampled token.

        `max_tokens`, one per prompt, overrides `options.max_tokens` per request (partial rollouts
        continue each cut completion with what is left of its budget). `images`, one list per prompt, are its
        pictures (vision-language models); each completion's prompt ids are then as vLLM expanded them."""
        generation.check_max_tokens(prompts, max_tokens)
        from vllm.exceptions import VLLMClientError

        opts = options or SamplingOptions()
        with self._lock:
            self._need(Phase.READY)
            inputs, per_request = generation.requests(prompts, opts, n, max_tokens, self._on_gpu(), images,
                                                      image_token(self.llm.llm_engine.model_config.hf_config))
            self.ensure_alive()
            generation.check_lengths(self.llm, prompts)
            try:
                outs = self.llm.generate(inputs, per_request, use_tqdm=False, lora_request=self.lora)
            except VLLMClientError as e:  # vLLM refused a request before running any: it keeps serving
                raise errors.BadRequest(f"vLLM refused the request: {e}") from e
            except Exception as e:
                self.fail(f"generate failed: {self.cause(e)}")  # the engine died: free what it leaves behind now
                raise errors.EngineNotRunning(f"vLLM failed while generating: {self.cause(e)}") from e
            records = routing.take(self.llm) if self.cfg.routing_replay else None
        self._served()
        result = generation.completions(outs)
        if records is not None:
            routing.attach(records, outs, result, *self._routing)
        return result

    @contextmanager
    def serving(self) -> Iterator[tuple[Any, Any]]:
        """(the live vLLM `LLM`, the served LoRA request or None) with the engine's lock held, so no update
        or other generate runs meanwhile: for callers that drive vLLM's engine loop themselves (turns.py).
        vLLM failing inside with its processes dead marks the engine FAILED, as generate does."""
        with self._lock:
            self._need(Phase.READY)
            self.ensure_alive()
            try:
                yield self.llm, self.lora
            except Exception as e:
                if self.llm is not None and self.procs.any_dead():
                    self.fail(f"vLLM failed while serving turns: {self.cause(e)}")
                    raise errors.EngineNotRunning(f"vLLM failed while serving turns: {self.cause(e)}") from e
                raise
        self._served()

    def _served(self) -> None:
        """A generation completed: the end of a recovery when the engine had failed (`recovery`)."""
        seconds = self.recovery.served()
        if seconds is not None:
            log.warning("recovered: a generation completed %.1fs after the engine was found failed (restart %d)",
                        seconds, self.restarts)

    @property
    def max_model_len(self) -> int:
        """vLLM's context length (prompt + generated tokens), as the engine started."""
        if self.llm is None:
            raise errors.EngineNotRunning(f"the vLLM engine is {self.phase.value}")
        return int(self.llm.llm_engine.model_config.max_model_len)

    # ---- status -----------------------------------------------------------------------------------
    def status(self) -> EngineStatus:
        open_call = self.watch.open_call()
        limit = self.watch.deadline("step") if open_call is None else open_call.deadline
        return EngineStatus(
            role=self.role, phase=self.phase, version=self.version, model_dir=self.model_dir, dummy=self.dummy,
            error=self.error, timings=dict(self.timings), updated=time.time(), restarts=self.restarts,
            steps=self.watch.steps, stalled_s=0.0 if open_call is None else open_call.stalled_s,
            busy=None if open_call is None else open_call.what, stall_deadline_s=limit.seconds,
            stall_deadline=limit.describe(self.watch.ceiling_s), recoveries=self.recovery.recoveries,
            recovery_s=self.recovery.last_s, pids=sorted(self.procs.procs),
            spare=None if self.spare is None else self.spare.state,
            spares_taken=0 if self.spare is None else self.spare.taken,
        )

    def set_phase(self, phase: Phase, error: str | None = None) -> None:
        self.phase = phase
        self.error = error if phase == Phase.FAILED else None
        ops.publish_status(self.registry, self.status)

    def _op(self, kind: str, **args: Any) -> AbstractContextManager[None]:
        return ops.recorded(self.registry, kind, args, lambda: self.version)
