"""Sidecars of a Tandem pod: the Megatron trainer, the vLLM rollout, rewards and RL algorithms."""
