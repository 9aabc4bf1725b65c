"""The trainer's engine layer: what runs the model.

`interface` (the `TrainerEngine` protocol), `engine_choice` (`build_engine`, which picks one by `trainer.engine`),
`common` (what every engine shares: `EngineError`, `Parallelism`, the process group, data-parallel reductions), the
two engines (`megatron_engine` with `megatron_forward`, `megatron_build`, `megatron_export`, `segment_attention`;
`hf_engine` with `hf_weights` and `lora`, transformers + FSDP2) and what only engines use: packed batches
(`micro_batches`), log-probs from logits or hidden states (`heads`, `chunked_logprobs`) and host offload
(`offload`); on a CPU rank, of either engine, the CPU compatibility layer (`cpu_compat`). Nothing here knows the RL
loop (`..loop`) or its reporting (`..observe`).
"""
