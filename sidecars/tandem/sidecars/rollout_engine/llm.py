"""vLLM's `LLM` as the rollout engine builds and ends it: its arguments, its shutdown, its stuck waiters.

Role: the vLLM-facing half of the engine's lifecycle, without the engine's state: the `LLM` of an
`EngineConfig` (dtype, eager mode, LoRA, routing replay, the worker extension that loads versions in place),
its engine core shut down, the accelerator's cache emptied, and the calls blocked on a dead engine core failed.
Caller: `engine.RolloutEngine` (start, terminate, the supervisor's `release_waiters`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from tandem.checkpoint_engine.versions import adapters
from tandem.sidecars.rollout_engine import routing
from tandem.sidecars.rollout_engine.config import EXTENSION, EngineConfig, cpu_worker_binding, prepare_env
from tandem.sidecars.rollout_engine.procs import EngineProcesses

log = logging.getLogger(__name__)


def on_gpu() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def enforce_eager(cfg: EngineConfig) -> bool:
    if not on_gpu() or cfg.routing_replay:
        return True  # vLLM-CPU: no CUDA graphs; routing replay's recording runs in Python (routing.py)
    return False if cfg.enforce_eager is None else cfg.enforce_eager


def dtype(cfg: EngineConfig) -> str:
    if cfg.dtype is not None:
        return cfg.dtype
    import torch

    return "auto" if torch.cuda.is_available() else "float32"


def new_llm(llm_class: Any, cfg: EngineConfig, model_dir: str, dummy: bool) -> Any:
    """vLLM's `LLM` of `cfg` over `model_dir` (dummy: random weights, a version loaded next)."""
    lora: dict[str, Any] = {}
    if cfg.lora_rank is not None:
        lora = {"enable_lora": True, "max_lora_rank": adapters.vllm_max_rank(cfg.lora_rank), "max_loras": 1}
    return llm_class(
        model=model_dir,
        load_format="dummy" if dummy else "auto",
        tensor_parallel_size=cfg.tensor_parallel,
        dtype=dtype(cfg),
        max_model_len=cfg.max_model_len,
        enforce_eager=enforce_eager(cfg),
        seed=cfg.seed,
        gpu_memory_utilization=cfg.gpu_memory_utilization,
        enable_sleep_mode=cfg.enable_sleep_mode,
        worker_extension_cls=EXTENSION,
        # the log-probs of the distribution each token was drawn from (after temperature, top-k, top-p), which
        # the trainer scores with its logits divided by the temperature; vLLM's default is the raw model's
        logprobs_mode="processed_logprobs",
        **lora,
        **routing.llm_kwargs(cfg.routing_replay),
        # a picture's normalization (mean, std) stays in the processor: on the device (Qwen2.5-VL and others) vLLM
        # holds it in persistent buffers that a dummy start fills at random and no version carries
        **({"mm_device_do_normalize": False} | cfg.llm_kwargs),
    )


@dataclass
class Launched:
    """A started vLLM `LLM` and the processes it started (its engine core and workers)."""

    llm: Any
    procs: EngineProcesses
    model_dir: str
    dummy: bool
    start_s: float


def launch(cfg: EngineConfig, model_dir: str, dummy: bool) -> Launched:
    """vLLM's `LLM` of `cfg` over `model_dir`, its processes recorded (procs.py: the children that appeared during
    its start); what a half-started one left running is reaped before the error propagates. `dummy` is dropped
    when the engine serves adapters (they apply to the base model's own weights)."""
    t = time.perf_counter()
    prepare_env(cfg)
    from vllm import LLM

    dummy = dummy and cfg.lora_rank is None
    procs = EngineProcesses.before_start()
    try:
        with cpu_worker_binding(cfg, on_gpu()):
            started = new_llm(LLM, cfg, model_dir, dummy)
    except BaseException:
        procs.record()
        procs.reap(grace_s=cfg.shutdown_timeout_s)
        raise
    procs.record()
    return Launched(started, procs, model_dir, dummy, time.perf_counter() - t)


def discard(launched: Launched, timeout_s: float) -> list[str]:
    """Shut a launched engine down and free what its processes left (shm segments); the segments removed."""
    launched.procs.refresh()
    shutdown(launched.llm, timeout_s)
    return launched.procs.reap(grace_s=timeout_s)


def shutdown(llm: Any, timeout_s: float) -> None:
    """Shut vLLM's engine core down; a dead engine may fail to, with nothing left to free."""
    try:
        llm.llm_engine.engine_core.shutdown(timeout=timeout_s)
    except Exception as e:
        log.warning("vLLM shutdown: %s", e)


def empty_cache() -> None:
    """Hand the accelerator's cached memory back (best effort)."""
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:  # noqa: S110 - best effort
        pass


def release_waiters(llm: Any) -> int:
    """Fail the calls blocked on `llm`'s dead engine core, each with vLLM's own EngineDeadError: a utility
    call's future (a reload's collective_rpc, a prefix-cache reset) and a generation step's outputs queue.
    Returns the waiters woken."""
    from vllm.v1.engine.exceptions import EngineDeadError

    client = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
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
