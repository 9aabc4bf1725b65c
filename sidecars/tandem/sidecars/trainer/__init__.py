"""Trainer sidecar, in three layers: `engines` (Megatron, transformers + FSDP2: what runs the model), `loop`
(the RL driver and its phases, rollout sources, eval, resume and durable state) and `observe` (timers,
memory, Prometheus, TensorBoard/MLflow). `__main__` starts the ranks (`rank`) and the driver."""
