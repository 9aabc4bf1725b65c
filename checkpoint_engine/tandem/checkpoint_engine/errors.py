"""Typed errors of the checkpoint engine, each with the HTTP status the control API maps it to.

Callers: layout/registry/publisher/rollout_engine raise them; api.py turns them into responses
(`status_code`), and the rollout sidecar catches them by type. Never `assert` for validation.
"""

from __future__ import annotations


class CheckpointEngineError(Exception):
    """Base of every error raised on purpose by the checkpoint engine."""

    status_code = 500
    code = "internal"


class VersionNotFound(CheckpointEngineError):
    """No complete version with that number (or no version at all) is registered."""

    status_code = 404
    code = "version_not_found"


class InvalidVersion(CheckpointEngineError):
    """A version exists but does not fit the engine: names, shapes or dtypes differ."""

    status_code = 422
    code = "invalid_version"


class TornVersion(InvalidVersion):
    """A version whose files are missing, truncated, or whose index is unreadable."""

    code = "torn_version"


class ChecksumMismatch(InvalidVersion):
    """A tensor's bytes do not match the checksum recorded when it was written."""

    code = "checksum_mismatch"


class WrongPhase(CheckpointEngineError):
    """The operation is not allowed in the engine's current phase (e.g. update while stopped)."""

    status_code = 409
    code = "wrong_phase"


class EngineNotRunning(CheckpointEngineError):
    """The vLLM engine is not started (or died)."""

    status_code = 503
    code = "engine_not_running"


class RegistryUnavailable(CheckpointEngineError):
    """etcd could not be reached or a transaction could not be completed; safe to retry."""

    status_code = 503
    code = "registry_unavailable"


class RegistryAuthFailed(CheckpointEngineError):
    """etcd refused this client's user (wrong password, unknown user, or none given where etcd
    requires one); retrying will not help."""

    status_code = 401
    code = "registry_auth_failed"


class RegistryPermissionDenied(CheckpointEngineError):
    """etcd refused a request on a key this client's user may not touch (another job's prefix)."""

    status_code = 403
    code = "registry_permission_denied"


class VersionExists(CheckpointEngineError):
    """A publisher tried to register a version number that is already registered."""

    status_code = 409
    code = "version_exists"


class UnsupportedOperation(CheckpointEngineError):
    """The core behind the API does not implement this operation (e.g. update on a publisher)."""

    status_code = 405
    code = "unsupported"


class BadRequest(CheckpointEngineError):
    """The request does not fit itself (e.g. per-prompt lists of another length than the prompts)."""

    status_code = 400
    code = "bad_request"


class PromptTooLong(BadRequest):
    """A prompt that leaves no room for one generated token in the engine's context length (max_model_len);
    refused before vLLM sees it, so the engine keeps serving."""

    code = "prompt_too_long"
