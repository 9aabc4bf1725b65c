"""RolloutEngine: owns one in-process vLLM `LLM` — dummy start, in-place update, generate, terminate.

Caller: the rollout sidecar (through routes.py and directly for /generate), tests and
bench/weight_sync.py. One engine per process; every public method is serialised by a lock.

update(v) resolves v in etcd, pins it, validates the shared-memory version (index, names,
shapes, dtypes against the model's HF parameters, every checksum) BEFORE touching vLLM — a
reload that fails half-way leaves vLLM half-loaded — and only then has every worker reload in
place (worker.shm_loader.ShmWeightLoader), then drops vLLM's prefix cache (KV of the old weights: if vLLM keeps
it, the update fails rather than serve a mix). A bad or torn version raises a typed error and the engine
keeps serving the previous weights. Phases and operations are published in etcd (keys.engine/keys.op).
Adapter versions (adapters.py; `EngineConfig.lora_rank`): vLLM starts with LoRA enabled and the base
model's own weights; a version of adapters is checked the same way (names and shapes against the base's
linear layers, rank, checksums), written as a PEFT directory beside the versions and added to vLLM as the
LoRA adapter every later generate uses (id = version); the previous adapter is then removed. A full version
on such an engine reloads the base in place and serves it without adapter.
generate() refuses a prompt with no room for one generated token in max_model_len (`PromptTooLong`,
HTTP 400 naming the limit) before vLLM sees it, and any request vLLM itself refuses is a `BadRequest`:
neither leaves the engine FAILED.

vLLM's engine core and workers are recorded at start (procs.py); terminating the engine, or
finding it dead, waits until they are gone and unlinks the /dev/shm segments they leave behind.
Every step of vLLM's engine loop and every reload is timed (`step_watch.StepWatch`): a call open for too
long (its deadline follows the calls' recent durations: stall_deadline.py) is a hung engine, which `kill`
ends (SIGKILL to its processes, without the lock the hung call holds); the call then fails and the engine is
FAILED, naming the cause. Restarting a FAILED engine is the rollout sidecar's supervisor's
(`tandem.sidecars.rollout.supervisor`); the first generation completed after it ends the recovery it times
(recovery.py).
"""

from __future__ import annotations

import gc
import logging
import shutil
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tandem.checkpoint_engine import adapters, errors, layout
from tandem.checkpoint_engine.engine_status import EngineStatus, Phase, UpdateReport
from tandem.checkpoint_engine.sync_registry import SyncRegistry
from tandem.sidecars.rollout_engine import routing
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
from tandem.sidecars.rollout_engine.procs import EngineProcesses
from tandem.sidecars.rollout_engine.recovery import Recovery
from tandem.sidecars.rollout_engine.sampling import Completion, SamplingOptions, prompt_seeds
from tandem.sidecars.rollout_engine.step_watch import StepWatch

log = logging.getLogger(__name__)
__all__ = ["CPU_BIND_ENV", "CPU_RESERVED_ENV", "EXECUTE_TIMEOUT_S", "EXTENSION", "EngineConfig", "RolloutEngine",
           "cpu_threads_bind", "cpu_worker_binding", "expected_parameters", "prepare_env"]


def sampling_params(opts: SamplingOptions, n: int, seed: int | None) -> Any:
    """vLLM's SamplingParams for `opts`, with the sampled token's log-prob returned (generate, turns.py)."""
    from vllm import SamplingParams

    return SamplingParams(n=n, logprobs=0, temperature=opts.temperature, top_p=opts.top_p, top_k=opts.top_k,
                          max_tokens=opts.max_tokens, min_tokens=opts.min_tokens, seed=seed,
                          stop=opts.stop or None, stop_token_ids=opts.stop_token_ids, ignore_eos=opts.ignore_eos)


def completion(out: Any, c: Any, prompt_index: int = 0, sample_index: int = 0) -> Completion:
    """One of vLLM's outputs `c` of request output `out` with the log-prob of every sampled token."""
    ids = list(c.token_ids)
    logprobs = [float(step[t].logprob) for step, t in zip(c.logprobs or [], ids, strict=False)]
    return Completion(prompt_index=prompt_index, sample_index=sample_index,
                      prompt_token_ids=list(out.prompt_token_ids or []), token_ids=ids, logprobs=logprobs,
                      text=c.text, finish_reason=c.finish_reason)


class RolloutEngine:
    def __init__(self, config: EngineConfig, registry: SyncRegistry | None = None, role: str = "rollout") -> None:
        self.cfg, self.registry, self.role = config, registry, role
        self.llm: Any = None
        self.phase = Phase.STOPPED
        self.version: int | None = None
        self.model_dir: str | None = None
        self.dummy = False
        self.error: str | None = None
        self.timings: dict[str, float] = {}
        self._expected: dict[str, layout.Expected] = {}
        self._optional: set[str] = set()
        self._lock = threading.RLock()
        self._stale_pins: set[int] = set()
        self._sleep_level = 0
        self.procs = EngineProcesses()
        self.lora: Any = None  # the LoRARequest of the adapter version served (adapter versions only)
        self.watch = StepWatch()  # how long the call into vLLM now in progress has run, and may
        self.recovery = Recovery()  # from a failure found (the supervisor) to the first generation after it
        self.killed_for: str | None = None  # why `kill` ended the engine's processes (a hang)
        self.restarts = 0  # engines started again after a failure (the sidecar's supervisor counts)
        self.recovering = False  # the supervisor is starting it again: not ready (/health 503)
        self._routing = (0, 0)  # routing replay: (MoE layers, experts per token) recorded

    # ---- lifecycle -----------------------------------------------------------------------------
    def start(self, model_dir: str, dummy: bool = True) -> dict[str, float]:
        with self._lock, self._op("start", model_dir=model_dir, dummy=dummy):
            if self.phase not in (Phase.STOPPED, Phase.FAILED):
                raise errors.WrongPhase(f"start needs a stopped engine; it is {self.phase.value}")
            if self.llm is not None:
                self._destroy()
            self._set_phase(Phase.STARTING)
            t0 = time.perf_counter()
            try:
                prepare_env(self.cfg)
                from vllm import LLM

                t1 = time.perf_counter()
                self.procs = EngineProcesses.before_start()
                dummy = dummy and self.cfg.lora_rank is None  # adapters apply to the base's own weights
                with cpu_worker_binding(self.cfg, self._on_gpu()):
                    self.llm = self._new_llm(LLM, model_dir, dummy)
                t2 = time.perf_counter()
                self.procs.record()
                self.watch.wrap(self.llm.llm_engine)
                self.killed_for = None
                if self.cfg.routing_replay:
                    bound = routing.start_capture(self.llm)
                    self._routing = (int(bound["layers"]), int(bound["topk"]))
                dt = str(self.llm.llm_engine.model_config.dtype).removeprefix("torch.")
                self._expected, self._optional = expected_parameters(model_dir, dt)
            except Exception as e:
                self.procs.record()  # what a half-started vLLM left running
                self._destroy()
                self._set_phase(Phase.FAILED, error=f"start failed: {e}")
                raise
            self.model_dir, self.dummy, self.version, self.lora = model_dir, dummy, None, None
            self.timings.update({"import_s": t1 - t0, "start_s": t2 - t1, "start_total_s": time.perf_counter() - t0})
            self._set_phase(Phase.READY)
            return {k: self.timings[k] for k in ("import_s", "start_s", "start_total_s")}

    def _new_llm(self, llm_class: Any, model_dir: str, dummy: bool) -> Any:
        lora: dict[str, Any] = {}
        if self.cfg.lora_rank is not None:
            lora = {"enable_lora": True, "max_lora_rank": adapters.vllm_max_rank(self.cfg.lora_rank), "max_loras": 1}
        return llm_class(
            model=model_dir,
            load_format="dummy" if dummy else "auto",
            tensor_parallel_size=self.cfg.tensor_parallel,
            dtype=self._dtype(),
            max_model_len=self.cfg.max_model_len,
            enforce_eager=self._enforce_eager(),
            seed=self.cfg.seed,
            gpu_memory_utilization=self.cfg.gpu_memory_utilization,
            enable_sleep_mode=self.cfg.enable_sleep_mode,
            worker_extension_cls=EXTENSION,
            # the log-probs of the distribution each token was drawn from (after temperature, top-k, top-p), which
            # the trainer scores with its logits divided by the temperature; vLLM's default is the raw model's
            logprobs_mode="processed_logprobs",
            **lora,
            **routing.llm_kwargs(self.cfg.routing_replay),
            **self.cfg.llm_kwargs,
        )

    @staticmethod
    def _on_gpu() -> bool:
        import torch

        return bool(torch.cuda.is_available())

    def _enforce_eager(self) -> bool:
        if not self._on_gpu() or self.cfg.routing_replay:
            return True  # vLLM-CPU: no CUDA graphs; routing replay's recording runs in Python (routing.py)
        return False if self.cfg.enforce_eager is None else self.cfg.enforce_eager

    def _dtype(self) -> str:
        if self.cfg.dtype is not None:
            return self.cfg.dtype
        import torch

        return "auto" if torch.cuda.is_available() else "float32"

    def terminate(self) -> dict[str, float]:
        """Destroy the LLM and free its memory (accelerator memory included); idempotent."""
        with self._lock, self._op("terminate"):
            t0 = time.perf_counter()
            self._set_phase(Phase.TERMINATING)
            self._destroy()
            self.version, self.lora = None, None
            self.timings["terminate_s"] = time.perf_counter() - t0
            self._set_phase(Phase.STOPPED)
            return {"terminate_s": self.timings["terminate_s"]}

    def _destroy(self) -> None:
        llm, self.llm = self.llm, None
        if self.lora is not None:  # the served adapter's PEFT directory in shm
            shutil.rmtree(self.lora.lora_path, ignore_errors=True)
            self.lora = None
        self.procs.refresh()  # workers and segments made since start, while they are still mapped
        if llm is not None:
            try:
                llm.llm_engine.engine_core.shutdown(timeout=self.cfg.shutdown_timeout_s)
            except Exception as e:  # a dead engine may fail to shut down: nothing left to free
                log.warning("vLLM shutdown: %s", e)
            del llm
        gc.collect()
        removed = self.procs.reap(grace_s=self.cfg.shutdown_timeout_s)
        if removed:
            log.info("removed %d shared-memory segments vLLM left: %s", len(removed), ", ".join(removed))
        try:
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        except Exception:  # noqa: S110 - best effort
            pass

    def sleep(self, level: int = 1) -> None:
        """Free accelerator memory but keep the process; level 2 also drops the weights (an update
        is needed after wake_up). vLLM's CPU worker ignores both levels."""
        with self._lock, self._op("sleep", level=level):
            self._need(Phase.READY)
            self.llm.sleep(level=level)
            self._sleep_level = level
            self._set_phase(Phase.SLEEPING)

    def wake_up(self) -> None:
        with self._lock, self._op("wake_up"):
            self._need(Phase.SLEEPING)
            self.llm.wake_up()
            if self._sleep_level == 2 and self.cfg.enable_sleep_mode:
                self.version = None  # the weights were discarded: load a version next
            self._set_phase(Phase.READY)

    # ---- weights --------------------------------------------------------------------------------
    def update(self, version: int | None = None) -> UpdateReport:
        """Load version `version` (default: the latest registered) from shared memory."""
        with self._lock, self._op("update", version=version):
            if self.registry is None:
                raise errors.UnsupportedOperation("update by version needs an etcd registry")
            self._need(Phase.READY)
            t0 = time.perf_counter()
            reg = self.registry
            self._release_stale_pins()
            v = reg.latest() if version is None else version
            if v is None:
                raise errors.VersionNotFound("no version is registered yet")
            record = reg.version_record(v)
            reg.pin(v)
            try:
                local = layout.version_dir(self.cfg.shm_root, self.cfg.job, v)
                path = local if local.exists() else Path(record["dir"])
                shard_digests = [s["digest"] for s in reg.shard_records(v)]
                t1 = time.perf_counter()
                return self._load(path, v, t0, t1, shard_digests)
            finally:
                try:
                    reg.unpin(v)
                except errors.RegistryUnavailable:
                    self._stale_pins.add(v)

    def update_from_path(self, path: str | Path) -> UpdateReport:
        """Load a version directory directly (no etcd): same validation, same load."""
        with self._lock, self._op("update_from_path", path=str(path)):
            self._need(Phase.READY)
            t0 = time.perf_counter()
            return self._load(Path(path), None, t0, t0, None)

    def _load(self, path: Path, v: int | None, t0: float, t1: float, digests: list[str] | None) -> UpdateReport:
        index = layout.read_index(path)
        if v is not None and index.version != v:
            raise errors.TornVersion(f"{path} holds version {index.version}, not {v}")
        if digests is not None and digests != [s.digest for s in index.shards]:
            raise errors.TornVersion(f"shards of {path} differ from those registered for version {v}")
        if index.adapter is not None:
            if self.cfg.lora_rank is None:
                raise errors.InvalidVersion(f"version {index.version} holds LoRA adapters only, and this engine "
                                            "serves whole versions (started without trainer.lora.sync: adapter)")
            dtype = next(iter(self._expected.values())).dtype
            layout.validate(index, adapters.expected(index, self._expected, dtype))
        else:
            layout.validate(index, self._expected, self._optional)
        mapped = layout.MappedVersion(path, index)
        mapped.verify_checksums()
        t2 = time.perf_counter()
        self._check_alive()
        if index.adapter is not None:
            workers = [self._serve_adapter(mapped, index)]
        else:
            self._set_phase(Phase.UPDATING)
            try:
                with self.watch.busy("reload"):
                    workers = self.llm.collective_rpc("tandem_load_shm", args=(str(path), index.model_dump_json()))
                    self._forget_prefixes()
            except Exception as e:
                if self.procs.any_dead():  # killed (a hang) or crashed mid-reload: free what it left
                    self._destroy()
                self._set_phase(Phase.FAILED, error=f"reload of version {index.version} failed: {self._cause(e)}")
                raise errors.CheckpointEngineError(f"reload failed; engine must be restarted: {e}") from e
            self._drop_adapter()  # the whole version is served as it is
        del mapped
        t3 = time.perf_counter()
        previous, self.version, self.dummy = self.version, index.version, False
        report = UpdateReport(
            version=index.version,
            previous=previous,
            bytes=index.total_bytes,
            tensors=len(index.tensors),
            resolve_s=t1 - t0,
            validate_s=t2 - t1,
            load_s=t3 - t2,
            total_s=t3 - t0,
            workers=list(workers),
        )
        self.timings.update(
            {
                "update_resolve_s": report.resolve_s,
                "update_validate_s": report.validate_s,
                "update_load_s": report.load_s,
                "update_total_s": report.total_s,
            }
        )
        self._set_phase(Phase.READY)
        return report

    def _adapter_dir(self, version: int) -> Path:
        return layout.job_dir(self.cfg.shm_root, self.cfg.job) / ".lora" / f"v{version:012d}"

    def _serve_adapter(self, mapped: layout.MappedVersion, index: layout.VersionIndex) -> dict[str, Any]:
        """Add a checked adapter version to vLLM as the LoRA adapter of every later generate. A failure
        before vLLM took it leaves the previous adapter served (the engine stays READY)."""
        from vllm.lora.request import LoRARequest

        t0 = time.perf_counter()
        assert index.adapter is not None
        out = adapters.write_peft_dir(mapped.tensors(), index.adapter, self._adapter_dir(index.version),
                                      base_dir=self.model_dir)
        request = LoRARequest(f"v{index.version}", index.version, str(out), load_inplace=True)
        try:
            with self.watch.busy("add adapter"):
                self.llm.llm_engine.add_lora(request)
        except Exception as e:
            shutil.rmtree(out, ignore_errors=True)
            if self.procs.any_dead():
                self._destroy()
                self._set_phase(Phase.FAILED, error=f"adding the adapters of version {index.version} failed: {e}")
            raise errors.InvalidVersion(f"vLLM refused the adapters of version {index.version}: {e}") from e
        old, self.lora = self.lora, request
        if old is not None and old.lora_int_id != request.lora_int_id:
            self._remove_adapter(old)
        self._forget_prefixes()
        return {"rank": 0, "load_s": time.perf_counter() - t0, "bytes": index.total_bytes, "adapter": str(out)}

    def _forget_prefixes(self) -> None:
        """Drop vLLM's cached prompt prefixes: their KV was computed with the previous weights, and a prompt
        that hit them would be served partly by the old version (on GPUs, blocks of 16 tokens: every chat
        template's system prompt). vLLM refuses while requests hold blocks, and returns False rather than
        raising; none runs under the engine's lock, and `reset_running_requests` preempts any that did."""
        if not self.llm.reset_prefix_cache(reset_running_requests=True):
            why = "vLLM kept its prefix cache (blocks still held): prompts would reuse the previous weights' KV"
            self._set_phase(Phase.FAILED, error=why)
            raise errors.CheckpointEngineError(f"{why}; engine must be restarted")

    def _drop_adapter(self) -> None:
        old, self.lora = self.lora, None
        if old is not None:
            self._remove_adapter(old)

    def _remove_adapter(self, request: Any) -> None:
        try:
            self.llm.llm_engine.remove_lora(request.lora_int_id)
        except Exception as e:  # noqa: BLE001 - vLLM evicts it anyway (max_loras 1); the files go regardless
            log.warning("removing LoRA adapter %s: %s", request.lora_name, e)
        shutil.rmtree(request.lora_path, ignore_errors=True)

    def _release_stale_pins(self) -> None:
        for v in list(self._stale_pins):
            try:
                self.registry.unpin(v)  # type: ignore[union-attr]
                self._stale_pins.discard(v)
            except errors.RegistryUnavailable:
                return

    # ---- generation -----------------------------------------------------------------------------
    def generate(
        self,
        prompts: Sequence[str | Sequence[int]],
        options: SamplingOptions | None = None,
        n: int = 1,
        max_tokens: Sequence[int] | None = None,
    ) -> list[list[Completion]]:
        """n completions per prompt, with token ids and the log-prob of every sampled token.

        `max_tokens`, one per prompt, overrides `options.max_tokens` per request (partial rollouts
        continue each cut completion with what is left of its budget)."""
        if max_tokens is not None and len(max_tokens) != len(prompts):
            raise errors.BadRequest(f"max_tokens has {len(max_tokens)} entries for {len(prompts)} prompts")
        from vllm.exceptions import VLLMClientError
        from vllm.inputs import TokensPrompt

        opts = options or SamplingOptions()
        with self._lock:
            self._need(Phase.READY)
            if opts.seed is not None and not self._on_gpu():
                # vLLM 0.32 on CPU: a seeded request whose prefill gets chunked (a batch of prompts over
                # the step's token budget) rewinds its generator's offset, which CPU generators refuse,
                # and the engine dies ("CPU Generator does not use offset"). The engine's seed still holds.
                opts = opts.model_copy(update={"seed": None})
            params = sampling_params(opts, n, opts.seed)
            per_request: Any = params
            if max_tokens is not None or opts.seed is not None:
                per_request = [params.clone() for _ in prompts]
            if max_tokens is not None:
                for sp, m in zip(per_request, max_tokens, strict=True):
                    sp.max_tokens = int(m)
            if opts.seed is not None:
                for sp, s in zip(per_request, prompt_seeds(opts.seed, len(prompts)), strict=True):
                    sp.seed = s
            inputs: list[Any] = [p if isinstance(p, str) else TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
            self._check_alive()
            self._check_lengths(prompts)
            try:
                outs = self.llm.generate(inputs, per_request, use_tqdm=False, lora_request=self.lora)
            except VLLMClientError as e:  # vLLM refused a request before running any: it keeps serving
                raise errors.BadRequest(f"vLLM refused the request: {e}") from e
            except Exception as e:
                if self.procs.any_dead():  # the engine died: free what it leaves behind now
                    self._destroy()
                self._set_phase(Phase.FAILED, error=f"generate failed: {self._cause(e)}")
                raise errors.EngineNotRunning(f"vLLM failed while generating: {self._cause(e)}") from e
            records = routing.take(self.llm) if self.cfg.routing_replay else None
        self._served()
        result = [[completion(out, c, i, j) for j, c in enumerate(out.outputs)] for i, out in enumerate(outs)]
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
            self._check_alive()
            try:
                yield self.llm, self.lora
            except Exception as e:
                if self.llm is not None and self.procs.any_dead():
                    self._destroy()
                    self._set_phase(Phase.FAILED, error=f"vLLM failed while serving turns: {self._cause(e)}")
                    raise errors.EngineNotRunning(f"vLLM failed while serving turns: {self._cause(e)}") from e
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

    def _check_lengths(self, prompts: Sequence[str | Sequence[int]]) -> None:
        """PromptTooLong, naming the prompt and the limit, for a prompt with no room for a generated token."""
        limit = int(self.llm.llm_engine.model_config.max_model_len)
        tokenizer: Any = self.llm.get_tokenizer() if any(isinstance(p, str) for p in prompts) else None
        for i, p in enumerate(prompts):
            n = len(tokenizer.encode(p)) if isinstance(p, str) else len(p)  # as vLLM tokenizes a text prompt
            if n >= limit:
                raise errors.PromptTooLong(f"prompt {i} has {n} tokens: the engine's context length (max_model_len) "
                                           f"is {limit} tokens, so a prompt may have at most {limit - 1}")

    # ---- status -----------------------------------------------------------------------------------
    def status(self) -> EngineStatus:
        open_call = self.watch.open_call()
        limit = self.watch.deadline("step") if open_call is None else open_call.deadline
        return EngineStatus(
            role=self.role,
            phase=self.phase,
            version=self.version,
            model_dir=self.model_dir,
            dummy=self.dummy,
            error=self.error,
            timings=dict(self.timings),
            updated=time.time(),
            restarts=self.restarts,
            steps=self.watch.steps,
            stalled_s=0.0 if open_call is None else open_call.stalled_s,
            busy=None if open_call is None else open_call.what,
            stall_deadline_s=limit.seconds,
            stall_deadline=limit.describe(self.watch.ceiling_s),
            recoveries=self.recovery.recoveries,
            recovery_s=self.recovery.last_s,
        )

    # ---- failures ---------------------------------------------------------------------------------
    def kill(self, cause: str) -> int:
        """SIGKILL vLLM's processes (a hung engine: its call never returns), without the engine's lock,
        which that call holds. The call then fails, and the engine goes FAILED naming `cause`. Returns
        the processes signalled."""
        self.killed_for = cause
        self.procs.refresh()
        alive = self.procs.alive()
        for p in alive:
            try:
                p.kill()
            except Exception as e:  # noqa: BLE001 - gone meanwhile
                log.debug("kill %d: %s", p.pid, e)
        log.warning("killed vLLM's processes %s: %s", [p.pid for p in alive], cause)
        return len(alive)

    def release_waiters(self) -> int:
        """Fail the calls blocked on a dead engine core. vLLM 0.32's blocking client never completes them
        itself: a utility call (a reload's collective_rpc, a prefix-cache reset) waits on a future its dead
        core will not answer, a generation step on an outputs queue nothing fills any more. Each gets
        vLLM's own EngineDeadError, so the call fails (the engine goes FAILED) and frees the engine's lock.
        Called by the supervisor once a process of a busy engine is dead. Returns the waiters woken."""
        from vllm.v1.engine.exceptions import EngineDeadError

        client = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        woken = 0
        for fut in list(getattr(client, "utility_results", {}).values()):
            if not fut.done():
                fut.set_exception(EngineDeadError(suppress_context=True))
                woken += 1
        queue = getattr(client, "outputs_queue", None)
        if queue is not None:
            queue.put_nowait(EngineDeadError(suppress_context=True))
            woken += 1
        return woken

    def check_alive(self) -> bool:
        """False (and the engine FAILED, what its processes left freed) when an idle engine's processes
        died; True while it serves or is busy (a call in progress finds a death itself)."""
        if not self._lock.acquire(blocking=False):
            return True
        try:
            if self.phase != Phase.READY:
                return self.phase != Phase.FAILED
            self._check_alive()
            return True
        except errors.EngineNotRunning:
            return False
        finally:
            self._lock.release()

    def mark_failed(self, error: str) -> None:
        with self._lock:
            self._set_phase(Phase.FAILED, error=error)

    def _cause(self, e: BaseException) -> str:
        return f"{self.killed_for} ({e})" if self.killed_for else str(e)

    def _check_alive(self) -> None:
        """Refuse to use an engine whose processes died (vLLM 0.32's blocking client would wait for
        their output forever), after freeing what they left behind."""
        if self.llm is not None and self.procs.any_dead():
            self._destroy()
            self._set_phase(Phase.FAILED, error=self.killed_for or "a vLLM engine process died")
            raise errors.EngineNotRunning("a vLLM engine process died; start the engine again")

    def _need(self, phase: Phase) -> None:
        if self.phase == phase:
            return
        if self.phase in (Phase.STOPPED, Phase.FAILED) or self.llm is None:
            raise errors.EngineNotRunning(
                f"the vLLM engine is {self.phase.value}" + (f": {self.error}" if self.error else "")
            )
        raise errors.WrongPhase(f"needs phase {phase.value}; the engine is {self.phase.value}")

    def _set_phase(self, phase: Phase, error: str | None = None) -> None:
        self.phase = phase
        self.error = error if phase == Phase.FAILED else None
        if self.registry is not None:
            try:
                self.registry.put_status(self.status().model_dump(mode="json"))
            except errors.RegistryUnavailable as e:
                log.warning("could not publish status %s: %s", phase.value, e)

    @contextmanager
    def _op(self, kind: str, **args: Any) -> Iterator[None]:
        op_id = f"{time.time_ns()}-{kind}-{uuid.uuid4().hex[:6]}"
        rec: dict[str, Any] = {"op": kind, "args": args, "state": "running", "started": time.time()}
        self._put_op(op_id, rec)
        try:
            yield
        except Exception as e:
            rec.update(state="failed", error=f"{type(e).__name__}: {e}", finished=time.time())
            self._put_op(op_id, rec)
            raise
        rec.update(state="done", finished=time.time(), version=self.version)
        self._put_op(op_id, rec)

    def _put_op(self, op_id: str, rec: dict[str, Any]) -> None:
        if self.registry is None:
            return
        try:
            self.registry.put_op(op_id, rec)
        except errors.RegistryUnavailable as e:
            log.warning("could not publish operation %s: %s", op_id, e)
