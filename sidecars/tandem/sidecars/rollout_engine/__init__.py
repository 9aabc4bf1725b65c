"""The rollout engine: one pod's vLLM, owned here and served by the rollout sidecar (`tandem.sidecars.rollout`).

engine.py (`RolloutEngine`: start, validated in-place update from the checkpoint engine's shared memory,
LoRA adapter versions, generate, sleep, terminate), config.py (its settings and the environment vLLM reads),
procs.py (vLLM's processes, reaped), step_watch.py (hung-call detection) with stall_deadline.py (its deadline
at the job's pace), recovery.py (failure to first generation, timed), turns.py (multi-turn work in vLLM's
running batch), routes.py (its operations on the checkpoint engine's control API) and sampling.py (what a
rollout is asked and returns; the trainer imports only this one). The weights it loads come from
`tandem.checkpoint_engine` (versions in /dev/shm, the registry, the transports, the vLLM worker extension).
"""
