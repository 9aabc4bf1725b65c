"""Build a Megatron GPTModel that matches a HuggingFace directory, and load its weights.

Called by :meth:`MegatronEngine.from_hf`. Imports megatron lazily (after the CPU compatibility
layer) so that importing this module stays cheap. Holds: Megatron's parallel state (on the process group of
`common.start_process_group`), the HF config -> TransformerConfig mapping, and the safetensors -> Megatron
loader (each TP rank takes its slice, each PP stage its layers). What is not Megatron's (the error type, the
parallel layout, collectives over the data-parallel ranks) is in `common.py`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tandem.checkpoint_engine import convert
from tandem.checkpoint_engine.convert import ModelShape
from tandem.sidecars.trainer.engines.common import EngineError, Parallelism, SafetensorsDir, start_process_group


def init_distributed(tp: int, pp: int, ep: int = 1) -> Parallelism:
    """Start torch.distributed (if needed) and Megatron's model-parallel groups."""
    start_process_group()
    from megatron.core import parallel_state as ps

    world = torch.distributed.get_world_size()
    if world % (tp * pp):
        raise EngineError(f"world size {world} is not a multiple of tp*pp = {tp}*{pp}")
    if ps.model_parallel_is_initialized():
        if (
            ps.get_tensor_model_parallel_world_size() != tp
            or ps.get_pipeline_model_parallel_world_size() != pp
            or ps.get_expert_model_parallel_world_size() != ep
        ):
            # engines of one process share the groups; megatron.core.parallel_state.
            # destroy_model_parallel() first if the old engines are no longer used
            raise EngineError("model parallelism already initialised with other sizes")
    else:
        ps.initialize_model_parallel(
            tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, expert_model_parallel_size=ep
        )
    return Parallelism(
        tp=tp,
        pp=pp,
        dp=ps.get_data_parallel_world_size(),
        ep=ps.get_expert_model_parallel_world_size(),
        tp_rank=ps.get_tensor_model_parallel_rank(),
        pp_rank=ps.get_pipeline_model_parallel_rank(),
        dp_rank=ps.get_data_parallel_rank(),
        ep_rank=ps.get_expert_model_parallel_rank(),
    )


def check_experts(shape: ModelShape, ep: int) -> None:
    """Refuse an expert-parallel size the model cannot take: megatron would split a dense model's ranks
    into expert groups for nothing, and asserts deep inside the MoE layer on an expert count ep does not divide."""
    if ep > 1 and (not shape.num_experts or shape.num_experts % ep):
        raise EngineError(f"expert parallelism {ep} needs a mixture-of-experts model whose number of experts "
                          f"it divides; this model has {shape.num_experts or 'no'} experts")


def transformer_config(shape: ModelShape, par: Parallelism, dtype: torch.dtype, recompute: bool = False,
                       routing_replay: bool = False) -> Any:
    """Megatron TransformerConfig equal to the HF architecture, with every fusion off. `recompute`
    (trainer.activationCheckpointing): each layer keeps only its input for the backward and runs its
    forward again there (Megatron's full, uniform recompute, one layer per checkpoint). `routing_replay`
    (algorithm.routingReplay, MoE only): each router gets megatron's RouterReplay (see `routing_replay`).

    ``kv_channels`` is the HF ``head_dim`` (Qwen3's may differ from hidden / heads);
    ``qk_layernorm`` gives Qwen3's per-head q/k RMSNorm (same eps as the other norms).
    """
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.enums import AttnBackend

    moe: dict[str, Any] = {}
    if shape.num_experts:
        from megatron.core.transformer.moe import moe_utils

        # megatron-core 0.16 leaves this name undefined when Transformer Engine is absent.
        moe_utils.te_general_gemm = getattr(moe_utils, "te_general_gemm", None)  # type: ignore[attr-defined]
        moe = dict(
            num_moe_experts=shape.num_experts,
            moe_router_topk=shape.moe_top_k,
            moe_ffn_hidden_size=shape.ffn_hidden,
            moe_token_dispatcher_type="allgather",
            moe_grouped_gemm=False,
            moe_router_load_balancing_type="none",
            moe_router_pre_softmax=False,
            moe_aux_loss_coeff=0.0,
            moe_enable_routing_replay=routing_replay,
        )
    return TransformerConfig(
        num_layers=shape.num_layers,
        hidden_size=shape.hidden,
        ffn_hidden_size=shape.ffn_hidden,
        num_attention_heads=shape.num_heads,
        num_query_groups=shape.num_kv_heads,
        kv_channels=shape.head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=shape.rms_eps,
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        add_bias_linear=False,
        add_qkv_bias=shape.qkv_bias,
        qk_layernorm=shape.qk_norm,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=par.tp,
        pipeline_model_parallel_size=par.pp,
        expert_model_parallel_size=par.ep,
        # megatron trains MoE layers under tensor parallelism only with sequence parallelism (its
        # MoELayer raises otherwise); dense models keep every position on every TP rank
        sequence_parallel=bool(shape.num_experts) and par.tp > 1,
        use_cpu_initialization=True,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        fp16=dtype == torch.float16,
        bias_activation_fusion=False,
        masked_softmax_fusion=False,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        persist_layer_norm=False,
        attention_backend=AttnBackend.local,
        attention_softmax_in_fp32=True,
        **moe,
        **(dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1) if recompute
           else {}),
    )


class SequenceParallelRMSNorm(torch.nn.RMSNorm):  # type: ignore[misc]
    """torch's RMSNorm in a sequence-parallel layer, where each TP rank normalises its own part of
    the sequence: the weight is marked so that megatron's ``finalize_model_grads`` sums its
    gradient over the TP group. (megatron's own torch norm refuses sequence parallelism; its other
    norms need Apex or Transformer Engine.)"""

    def __init__(self, config: Any, hidden_size: int, eps: float = 1e-5, **_: Any) -> None:
        super().__init__(hidden_size, eps=eps)
        self.weight.sequence_parallel = True  # type: ignore[attr-defined]


def _sequence_parallel_spec(layer: Any, config: Any) -> Any:
    """The local layer spec with `SequenceParallelRMSNorm` for every norm, as this stage's block spec."""
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules, get_num_layers_to_build

    norms = dict(input_layernorm=SequenceParallelRMSNorm, pre_mlp_layernorm=SequenceParallelRMSNorm)
    layer = dataclasses.replace(layer, submodules=dataclasses.replace(layer.submodules, **norms))
    return TransformerBlockSubmodules(layer_specs=[layer] * get_num_layers_to_build(config),
                                      layer_norm=SequenceParallelRMSNorm)


def _segment_attention_spec(layer: Any) -> Any:
    """The local layer spec with `segment_attention.SegmentAttention` as its core attention (Megatron's own
    for a dense mask; one fused call per sample for the compact layout of long rows)."""
    from tandem.sidecars.trainer.engines.segment_attention import SegmentAttention

    attn = layer.submodules.self_attention
    attn = dataclasses.replace(attn, submodules=dataclasses.replace(attn.submodules, core_attention=SegmentAttention))
    return dataclasses.replace(layer, submodules=dataclasses.replace(layer.submodules, self_attention=attn))


def build_gpt(shape: ModelShape, config: Any) -> Any:
    """The bare GPTModel of this pipeline stage (fp32 params until wrapped).

    Llama 3.x RoPE scaling (``rope_type: llama3``) is megatron's ``rope_scaling``; ModelShape has
    already refused the llama3 parameters megatron cannot express.
    """
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    spec = get_gpt_layer_local_spec(
        num_experts=shape.num_experts or None,
        moe_grouped_gemm=False,
        qk_layernorm=shape.qk_norm,
        normalization="RMSNorm",
    )
    spec = _segment_attention_spec(spec)
    if config.sequence_parallel:
        spec = _sequence_parallel_spec(spec, config)
    theta = shape.rope_theta
    return GPTModel(
        config=config,
        transformer_layer_spec=spec,
        vocab_size=shape.megatron_vocab,
        max_sequence_length=shape.max_positions,
        pre_process=ps.is_pipeline_first_stage(),
        post_process=ps.is_pipeline_last_stage(),
        parallel_output=True,
        share_embeddings_and_output_weights=shape.tie_embeddings,
        position_embedding_type="rope",
        rotary_percent=1.0,
        rotary_base=int(theta) if theta.is_integer() else theta,
        rope_scaling=shape.rope_scaling_factor > 0,
        rope_scaling_factor=shape.rope_scaling_factor or 8.0,
    )


def global_name(local: str, layer_numbers: dict[int, int], expert_offset: int) -> str:
    """Megatron parameter name with global layer (and expert) numbers."""
    parts = local.split(".")
    if len(parts) > 2 and parts[0] == "decoder" and parts[1] == "layers":
        parts[2] = str(layer_numbers[int(parts[2])])
        if "local_experts" in parts:
            at = parts.index("local_experts") + 1
            parts[at] = str(int(parts[at]) + expert_offset)
    return ".".join(parts)


def layer_numbers(gpt: Any) -> dict[int, int]:
    """Local layer index -> global (0-based) layer number of this pipeline stage."""
    return {i: int(layer.layer_number) - 1 for i, layer in enumerate(gpt.decoder.layers)}


def expert_offset(shape: ModelShape, par: Parallelism) -> int:
    return par.ep_rank * (shape.num_experts // par.ep) if shape.num_experts else 0


def load_hf_weights(gpt: Any, source: Path | Callable[[str], torch.Tensor], shape: ModelShape,
                    par: Parallelism, skip: tuple[str, ...] = ()) -> int:
    """Copy HF weights into this rank's parameters; returns how many tensors were loaded.

    `source` is a HF directory (safetensors) or a name -> tensor loader (e.g. a published
    shared-memory version, when a restarted trainer resumes). Parameters named in `skip`
    (Megatron names, e.g. a critic's value head) are left as they are.
    """
    numbers, offset = layer_numbers(gpt), expert_offset(shape, par)
    params = {global_name(n, numbers, offset): p for n, p in gpt.named_parameters()}
    params = {n: p for n, p in params.items() if n not in skip}
    reader = SafetensorsDir(source) if isinstance(source, Path) else source
    loaded = 0
    with torch.no_grad():
        for name, full in convert.from_hf(shape, reader, names=list(params)):
            param = params[name]
            shard = convert.split_tp(name, full, par.tp, par.tp_rank)
            if tuple(shard.shape) != tuple(param.shape):
                raise EngineError(f"{name}: HF gives {tuple(shard.shape)}, model has {tuple(param.shape)}")
            param.copy_(shard)
            loaded += 1
    return loaded
