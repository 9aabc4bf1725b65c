"""The trainer's coordination: the RL loop over an engine.

At the root: `driver` (the loop, one screen), `start` (the context built once, the starting weights published),
`context` (what the phases share), `held_out` (the evaluator the Eval phase runs), `host_wait` (ranks wait for the
driver on the host) and `preflight` (the checks before the ranks start). In folders, by what they hold:
- `phases/`: one module per step of `driver.run`, each taking the context: `generate` (Rollout), `switch` (release,
  onload, offload), `inference`, `train`, `mismatch_guard` (the drift guard after Train), `publish` (publish,
  persist, export, sync), `evaluate` (Eval), `report` (progress and metrics rows);
- `rollout/`: where an iteration's completions come from: the rollout modes (`sources`, `partial`,
  `async_rollouts`, `dynamic_sampling`) and the driver's HTTP client of the rollouts (`rollout_client`,
  `rollout_health`);
- `data/`: the job's prompt dataset (`dataset`; `dataset_files`, the file read; `labelled`, KTO's rows);
- `forwards/`: what the Inference phase's forwards stand on: the reference policy (`reference`) and forwards split
  over data-parallel ranks (`sharded`);
- `recovery/`: restarts and durable state (`resume`, `persist`, `train_state`, `inflight`).
The context holds parts of `rollout/`, `data/`, `forwards/` and `recovery/`, and the phases take the context, so
the phases sit in a folder of their own above those parts (no import cycle between folders).
Stands on `..engines` and `..observe`.
"""
