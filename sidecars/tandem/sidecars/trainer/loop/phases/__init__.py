"""The steps of the RL loop, one module per phase of `driver.run`, each taking the loop's `TrainerContext`.

In the loop's order: `generate` (the Rollout phase: the iteration's samples from the job's rollout source, or
KTO's labelled rows), `switch` (the rollouts release the accelerator, the trainer onloads and offloads),
`inference` (reference, old-policy and teacher log-probs and critic values, overlapped with the rewards),
`train` (the optimizer steps), `mismatch_guard` (the drift guard on the train step's rollout/trainer mismatch),
`publish` (publish, persist, export, sync: a new weight version reaches the rollouts), `evaluate` (Eval on the
live rollouts) and `report` (the phase in etcd, each iteration's metrics row). Callers: `..driver.run` and
`..start` (the starting weights: publish, sync, offload, report).
"""
