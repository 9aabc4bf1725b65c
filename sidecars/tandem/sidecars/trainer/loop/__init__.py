"""The trainer's coordination: the RL loop over an engine.

`driver` (the loop, one screen) and `context` (each phase's work); where completions come from
(`sources`, `partial`, `async_rollouts`, `inflight`, `dynamic_sampling`, `rollout_client`, `labelled`,
`dataset`); evaluation (`evaluate`); the reference policy (`reference`); forwards split over data-parallel
ranks (`sharded`); restarts and state (`resume`, `persist`, `train_state`); rank coordination
(`host_wait`) and the checks before the ranks start (`preflight`). Stands on `..engines` and `..observe`.
"""
