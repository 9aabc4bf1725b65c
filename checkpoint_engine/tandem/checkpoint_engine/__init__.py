"""Checkpoint engine: HF-layout conversion, shm shards, etcd registry, transports, in-place vLLM updates."""
