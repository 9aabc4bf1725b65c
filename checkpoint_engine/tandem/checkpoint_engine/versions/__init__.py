"""A weight version's bytes, wherever they are: shared memory, a durable volume, a HuggingFace directory.

`layout` (the versioned, aligned shared-memory layout: its format, a version read and mapped without a copy,
checked and removed), `version_writer` (a version written into it: shard files, index, one rename), `hashing`
(tensor checksums), `slots` (spare shard files reused by the next version), `delta` (shard bytes encoded
against an older version), `adapters` (adapter-only LoRA versions), `durable` (copies on a volume, for resuming
after the pods are gone) and `hf_export` (HuggingFace model directories from a version). Knows nothing of etcd.
Callers: the publisher (`..service.publisher`), the transports, the registry (`VersionIndex`), the rollout
engine, the trainer's loop (persist, resume, export) and `tandem export`.
"""
