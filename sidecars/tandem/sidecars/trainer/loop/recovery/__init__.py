"""Restarts and durable state: what lets a job go on after its pods (and their shared memory) are gone.

`resume` (find the rollouts, and the version to resume from: shared memory, peers, the durable store), `persist`
(durable copies of published versions, in the background), `train_state` (each rank's optimizer and critic state
beside a durable copy) and `inflight` (rollouts generated but not trained yet, re-generated on resume). Callers:
`..start` (resume, the persister), `..context` (holds the persister), the Publish phase (`..phases.publish`:
persist, train_state), the Rollout phase and the rollout sources (`inflight`, `resume`), `..driver` (`inflight`).
"""
