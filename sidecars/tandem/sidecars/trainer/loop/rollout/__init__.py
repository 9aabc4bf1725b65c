"""Where an iteration's completions come from, and how the driver talks to the rollouts.

The rollout modes behind one interface (`sources`: synchronous, partial, multi-turn, asynchronous, and KTO's
labelled rows), with what they stand on: partial rollouts carried over (`partial`), the asynchronous producer
(`async_rollouts`), DAPO's dynamic sampling (`dynamic_sampling`); and the driver's HTTP client of the rollout
sidecars (`rollout_client`) with what makes a rollout unhealthy (`rollout_health`). Callers: the Rollout phase
(`..phases.generate`), `..start` and `..context` (the client), `..driver` (the sources' types) and the trainer's
`__main__` (`RolloutError`). Driver rank only.
"""
