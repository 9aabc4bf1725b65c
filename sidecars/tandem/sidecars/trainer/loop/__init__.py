"""The trainer's coordination: the RL loop over an engine.

`driver` (the loop, one screen), what its phases share (`context`, built by `start`) and the phases, in
order: `generation` (Rollout), `switch` (release, onload, offload), `inference`, `train`, `publish` (publish,
persist, export, sync), `evaluate` (Eval), `report` (progress and metrics rows). Where completions come from
(`sources`, `partial`, `async_rollouts`, `inflight`, `dynamic_sampling`, `rollout_client`, `labelled`,
`dataset`); held-out evaluation (`held_out`); the reference policy (`reference`); forwards split over
data-parallel ranks (`sharded`); restarts and state (`resume`, `persist`, `train_state`); rank coordination
(`host_wait`), the drift guard (`mismatch_guard`) and the checks before the ranks start (`preflight`).
Stands on `..engines` and `..observe`.
"""
