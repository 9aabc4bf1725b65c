"""vLLM worker extension: load a shared-memory version into the live model, in place.

Caller: the rollout engine (tandem.sidecars.rollout_engine.engine) creates `LLM(..., worker_extension_cls=
"tandem.sidecars.rollout_engine.worker.shm_loader.ShmWeightLoader")` and calls these methods through
`llm.collective_rpc("tandem_load_shm", args=(path, index_json))`; vLLM mixes this class into
every worker (one per tensor-parallel rank), so the methods run inside the worker processes.

Tensors inside collective_rpc arguments arrive as lists, so only the version directory and its
(already validated) index travel; each worker maps the shard files itself (MAP_SHARED, no copy)
and hands (HF name, view) pairs to `self.reload_weights(weights_iterator=...)`, the worker's
in-place reload that also re-runs the post-load processing (CPU linear weights are repacked,
which is why `model.load_weights` alone fails on CPU).

Vision-language models: a version carries transformers' names; a SigLIP or CLIP tower's are renamed to the
layout vLLM loads (`tower_names.vllm_name`) on the way in.

MoE on CPU: vLLM does not prepack a MoE layer's reloaded experts for its CPU kernel again; every reload is
followed by `moe_repack.repack_cpu_experts`, which does.

Tied embeddings: a HuggingFace checkpoint of a tied model has no `lm_head.weight`, and vLLM's
loader skips it for such models. vLLM's layerwise reload then finds nothing to load for the
output head, restores its old kernel tensors ("ParallelLMHead: Failed to load weights") and does
not re-run its post-load processing — on CPU the head keeps the GEMM weights packed at start, so
the live model kept its dummy output layer. After every reload the head is tied to the embedding
again and re-processed (`_tandem_retie`), so the output head always equals the new embedding; a
vision-language model's are its language model's (a tied SmolLM2 inside a LLaVA served its dummy head).

Tensor parallelism: vLLM's weight loaders (ColumnParallelLinear, RowParallelLinear,
VocabParallelEmbedding, QKV/MergedColumn) take the FULL checkpoint tensor and `narrow` it to the
worker's tp_rank before copying. Since the full tensor is only a view of the mapped file, each
worker of a TP=N rollout reads and copies only its own slice; no pre-slicing is needed.
Verified on CPU at TP=2 (tests/rollout_engine/test_rollout_engine.py): q/o/MLP split,
the single KV head replicated, greedy output equal to transformers' own decode.

AMX on CPU: vLLM's bf16 CPU attention picks AMX tile kernels where the CPU has them, but never asks
Linux for the AMX state (arch_prctl XCOMP_PERM); oneDNN does so only once it runs a bf16 GEMM itself.
A worker whose first AMX instruction came from vLLM's kernel died with SIGILL (exit -4) on its first
generate; whether it did depended on what the process had run before. Importing this module (vLLM
does, in each worker, before the model loads) asks for it once (`_request_amx`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tandem.checkpoint_engine.versions.layout import MappedVersion, VersionIndex
from tandem.checkpoint_engine.versions.tower_names import tower_of, vllm_name
from tandem.sidecars.rollout_engine.worker.moe_repack import repack_cpu_experts
from tandem.sidecars.rollout_engine.worker.routing_capture import RoutingCapture


def _request_amx() -> bool:
    """Ask the kernel for AMX tile state where the CPU has AMX (idempotent; False where it has none)."""
    import torch

    cpu = getattr(torch, "cpu", None)
    if cpu is None or not hasattr(cpu, "_is_amx_tile_supported") or not cpu._is_amx_tile_supported():
        return False
    return bool(cpu._init_amx())


_request_amx()


class ShmWeightLoader(RoutingCapture):
    """Mixed into vLLM's worker class; `self` is the worker (has reload_weights, model_runner). Also records
    routed experts for routing replay (`routing_capture.RoutingCapture`)."""

    def tandem_load_shm(self, path: str, index_json: str) -> dict[str, Any]:
        t0 = time.perf_counter()
        index = VersionIndex.model_validate_json(index_json)
        mapped = MappedVersion(Path(path), index)
        t1 = time.perf_counter()
        tower = tower_of(self.model_runner.model_config.hf_config)  # type: ignore[attr-defined]
        named = ((vllm_name(name, tower), view) for name, view in mapped.tensors())
        self.reload_weights(weights_iterator=named)  # type: ignore[attr-defined]
        repacked = repack_cpu_experts(self.model_runner.model)  # type: ignore[attr-defined]
        retied = self._tandem_retie()
        t2 = time.perf_counter()
        del mapped  # unmaps once vLLM's loader dropped its views
        return {"rank": self._tandem_rank(), "map_s": t1 - t0, "load_s": t2 - t1, "bytes": index.total_bytes,
                "retied": retied, "repacked_moe_layers": repacked}

    def tandem_ping(self) -> int:
        """A no-op round trip (measures the RPC overhead; health check of the workers)."""
        return self._tandem_rank()

    def tandem_load_dir(self, path: str) -> dict[str, Any]:
        """Reload from a HF directory (safetensors) — the slow path, kept for comparisons."""
        t0 = time.perf_counter()
        self.reload_weights(weights_path=path)  # type: ignore[attr-defined]
        repack_cpu_experts(self.model_runner.model)  # type: ignore[attr-defined]
        self._tandem_retie()
        return {"rank": self._tandem_rank(), "load_s": time.perf_counter() - t0}

    def tandem_param_info(self) -> dict[str, Any]:
        """vLLM-side parameter names and shapes of this rank (after TP slicing and fusing)."""
        model = self.model_runner.model  # type: ignore[attr-defined]
        return {
            "rank": self._tandem_rank(),
            "params": {n: list(p.shape) for n, p in model.named_parameters()},
        }

    def tandem_checksum_param(self, name: str) -> float:
        """Sum of one vLLM parameter (for tests that watch weights change)."""
        model = self.model_runner.model  # type: ignore[attr-defined]
        return float(dict(model.named_parameters())[name].detach().float().sum().item())

    def tandem_logits_weight_sum(self) -> dict[str, float]:
        """Sums of the embedding and of the output head's weights (tests: a tied head follows the embedding)."""
        model = self._tandem_language_model()
        embed = model.get_submodule("model.embed_tokens").weight
        head = model.get_submodule("lm_head").weight
        return {"embed": float(embed.detach().float().sum()), "head": float(head.detach().float().sum())}

    def _tandem_retie(self) -> bool:
        """Tie the output head to the reloaded embedding and redo its post-load processing (tied models)."""
        config = self.model_runner.model_config.hf_text_config  # type: ignore[attr-defined]
        if not getattr(config, "tie_word_embeddings", False):
            return False
        model = self._tandem_language_model()
        try:
            head = model.get_submodule("lm_head")
            embed = model.get_submodule("model.embed_tokens")
        except AttributeError:  # another module tree (or a pipeline stage without the head)
            return False
        if not hasattr(head, "weight") or not hasattr(embed, "weight"):
            return False
        if head.weight is not embed.weight:
            head.weight = embed.weight
        method = getattr(head, "quant_method", None)
        if method is not None:  # CPU: packs the GEMM weights again from the new embedding
            method.process_weights_after_loading(head)
        return True

    def _tandem_language_model(self) -> Any:
        """The model whose `lm_head` and `model.embed_tokens` are the text head and embedding: a vision-language
        model's language model (vLLM's `get_language_model`), else the model itself."""
        model = self.model_runner.model  # type: ignore[attr-defined]
        inner = getattr(model, "get_language_model", None)
        return inner() if callable(inner) else model

    def _tandem_rank(self) -> int:
        return int(getattr(self, "rank", 0))
