"""The rollout engine's settings and the process environment vLLM reads when it starts.

Role: `EngineConfig` (from the job by the rollout sidecar, `tandem.sidecars.rollout.__main__`); the
environment prepared before vLLM is imported (offline caches, CPU KV cache, cores kept for its engine loop,
the execute timeout, the worker extension on PYTHONPATH); CPU worker binding for tensor parallelism; the
HF parameters a version must match. Caller: engine.py (re-exports these names), tests, benches.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tandem import checkpoint_engine
from tandem.checkpoint_engine.versions import layout

EXTENSION = "tandem.sidecars.rollout_engine.worker.shm_loader.ShmWeightLoader"
CPU_RESERVED_ENV = "VLLM_CPU_NUM_OF_RESERVED_CPU"  # cores vLLM-cpu keeps for its engine loop (default 1)
EXECUTE_TIMEOUT_S = 3600  # vLLM's VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS (its default 300 s)
CPU_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"  # each CPU worker's cores, "|" between ranks
# the root (checkpoint_engine/, or site-packages once installed) of the namespace package holding EXTENSION
_CE_ROOT = str(Path(checkpoint_engine.__file__).resolve().parents[2])


@dataclass
class EngineConfig:
    shm_root: Path
    job: str
    tensor_parallel: int = 1
    dtype: str | None = None  # None: "auto" on a GPU, "float32" on CPU (bf16 works there too: worker.shm_loader
    # asks for the AMX state vLLM's bf16 CPU kernels need)
    max_model_len: int = 1024
    kv_cache_gib: int = 1  # VLLM_CPU_KVCACHE_SPACE on CPU
    gpu_memory_utilization: float = 0.85  # spec.rollout.gpuMemoryUtilization (tandem.spec.devices)
    enforce_eager: bool | None = None  # None: eager on CPU, CUDA graphs on a GPU (spec.rollout.cudaGraphs)
    seed: int = 0
    enable_sleep_mode: bool = False
    shutdown_timeout_s: float = 2.0  # graceful vLLM exit, then kill (vLLM's own default: 5 s)
    cpu_reserved_cores: int | None = None  # VLLM_CPU_NUM_OF_RESERVED_CPU on CPU (None: vLLM's default, 1)
    lora_rank: int | None = None  # trainer.lora.sync adapter: adapter versions served as LoRA of this rank;
    # the base weights then come from the model directory at start (never dummy)
    routing_replay: bool = False  # algorithm.routingReplay: record each token's routed experts (routing.py)
    llm_kwargs: dict[str, Any] = field(default_factory=dict)


def prepare_env(cfg: EngineConfig) -> None:
    """Environment vLLM reads at import/start: offline, private caches, small CPU KV cache, the cores
    it reserves for its engine loop on CPU."""
    cache = Path(os.environ.get("TANDEM_CACHE", Path.home() / ".cache" / "tandem"))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(cfg.kv_cache_gib))
    os.environ.setdefault("VLLM_CACHE_ROOT", str(cache / "vllm"))
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache / "inductor"))
    # vLLM declares its engine dead when one model step of its workers takes over 300 s; a CPU pod whose
    # cores are shared (or a long prefill on a small one) can take that long without anything being wrong,
    # and the loop has its own deadlines (trainer.processGroupTimeoutMinutes, the request timeouts)
    os.environ.setdefault("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", str(EXECUTE_TIMEOUT_S))
    if cfg.routing_replay:  # the recording reads the V1 runner's step layout (rollout_engine.routing)
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"
    if cfg.cpu_reserved_cores is not None:  # an explicit setting in the environment wins
        os.environ.setdefault(CPU_RESERVED_ENV, str(cfg.cpu_reserved_cores))
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if _CE_ROOT not in paths:  # worker processes must import the extension
        os.environ["PYTHONPATH"] = os.pathsep.join([_CE_ROOT, *[p for p in paths if p]])


def cpu_threads_bind(cores: Sequence[int], ranks: int) -> str:
    """VLLM_CPU_OMP_THREADS_BIND for `ranks` CPU workers: this process's cores split into `ranks`
    contiguous shares ("0,1|2,3"); with fewer cores than ranks, ranks share cores round-robin ("0|0" for two
    ranks on one core: vLLM takes only core ids per rank, or "nobind" for the whole setting)."""
    if len(cores) < ranks:
        return "|".join(str(cores[r % len(cores)]) for r in range(ranks))
    share, extra = divmod(len(cores), ranks)
    parts, at = [], 0
    for r in range(ranks):
        n = share + (1 if r < extra else 0)
        parts.append(",".join(str(c) for c in cores[at:at + n]))
        at += n
    return "|".join(parts)


@contextmanager
def cpu_worker_binding(cfg: EngineConfig, on_gpu: bool) -> Iterator[None]:
    """While vLLM spawns its workers: on CPU with TP > 1 and no binding given, each worker's cores
    (vLLM-cpu binds by NUMA node otherwise and refuses more workers than nodes: one node here, as in
    most containers). Restored after, so that a later engine of this process is not bound by it."""
    if on_gpu or cfg.tensor_parallel < 2 or CPU_BIND_ENV in os.environ:
        yield
        return
    os.environ[CPU_BIND_ENV] = cpu_threads_bind(sorted(os.sched_getaffinity(0)), cfg.tensor_parallel)
    try:
        yield
    finally:
        os.environ.pop(CPU_BIND_ENV, None)


def expected_parameters(model_dir: str, dtype: str) -> tuple[dict[str, layout.Expected], set[str]]:
    """HF parameter names/shapes/dtypes of the model in `model_dir`, built on the meta device (transformers'
    names in memory: a version's; a VLM's tower and projector included)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    config = AutoConfig.from_pretrained(model_dir)
    stored = _checkpoint_shapes(model_dir) if _experts(config) else {}
    if stored:  # transformers 5 fuses a MoE's experts in memory; versions (and vLLM) take the checkpoint's names
        expected = {n: layout.Expected(shape, dtype) for n, shape in stored.items()}
    else:
        with torch.device("meta"):  # a vision-language model (a vision_config) is an image-text-to-text one
            auto = AutoModelForImageTextToText if hasattr(config, "vision_config") else AutoModelForCausalLM
            model = auto.from_config(config)
        expected = {n: layout.Expected(tuple(t.shape), dtype) for n, t in model.state_dict().items()}
    tied = bool(getattr(config, "tie_word_embeddings", False))
    optional = {n for n in expected if tied and n.startswith("lm_head.")}
    return expected, optional


def _experts(config: Any) -> int:
    """The experts per MoE layer a HF config names (0: a dense model)."""
    return int(getattr(config, "num_local_experts", 0) or getattr(config, "num_experts", 0) or 0)


def _checkpoint_shapes(model_dir: str) -> dict[str, tuple[int, ...]]:
    """Tensor names and shapes of the safetensors checkpoint in `model_dir` (headers only; {} when none).
    A MoE checkpoint keeps one tensor per expert (e.g. mixtral's block_sparse_moe.experts.{e}.w1), which is
    what the trainer's export and vLLM's loader use, while transformers 5's model holds them fused."""
    from safetensors import safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    for file in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                shapes[name] = tuple(f.get_slice(name).get_shape())
    return shapes
