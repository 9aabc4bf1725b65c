"""The rollout engine's worker side: code that runs inside vLLM's worker processes, not in the rollout sidecar.

vLLM starts its workers as processes of their own and mixes `shm_loader.ShmWeightLoader` into their class
(`worker_extension_cls`, `rollout_engine.config.EXTENSION`); everything that class brings runs there:
- `shm_loader`: a version loaded in place from the pod's shared memory (verified by the engine side first),
  tied output heads re-tied, the CPU kernels' weights repacked; the AMX permission vLLM's bf16 CPU kernels need;
- `routing_capture`: the experts each MoE layer routes each token to (routing replay), read by the engine side's
  `rollout_engine.routing`;
- `moe_repack`: a MoE's experts prepacked again for vLLM-CPU's grouped GEMM after an in-place reload.
The engine side (`engine.py`, `turns.py`, ...) reaches these only through `collective_rpc`. Nothing outside
`tandem.sidecars.rollout_engine` imports vLLM (.importlinter: "vLLM has one home").
"""
