"""The rollout engine: one pod's vLLM, owned here and served by the rollout sidecar (`tandem.sidecars.rollout`).

engine.py (`RolloutEngine`: vLLM's lifecycle — start, sleep, terminate — generation and status), weights.py
(`EngineWeights`: a version resolved, verified and loaded in place from the checkpoint engine's shared memory;
LoRA adapter versions), llm.py (vLLM's `LLM` built and shut down), generation.py (requests in, completions out),
ops.py (phases and operations in etcd), config.py (its settings and the environment vLLM reads), procs.py
(vLLM's processes, reaped), step_watch.py (hung-call detection) with stall_deadline.py (its deadline at the
job's pace), recovery.py (failure to first generation, timed), turns.py (multi-turn work in vLLM's running
batch), routes.py (its operations on the checkpoint engine's control API) and sampling.py (what a rollout is
asked and returns; the trainer imports only this one). The weights it loads come from
`tandem.checkpoint_engine` (versions in /dev/shm, the registry, the transports); vLLM's workers load them
(worker/).
"""
