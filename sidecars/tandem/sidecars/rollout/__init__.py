"""The rollout sidecar: a vLLM engine owned by the checkpoint engine, served over HTTP."""
