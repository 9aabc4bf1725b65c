"""Trainer sidecar: the RL loop (driver), Megatron engine, rollouts client, eval, durable copies."""
