"""Who may read a pod's shards: a challenge-response on each holder-server connection.

Callers: holder_server.py (challenges every accepted connection) and wire.py (`Connection` answers with
the key its `Peer` carries); this module holds only the key and the arithmetic. The key is derived from the job's token
(TANDEM_TOKEN, the `<job>-token` Secret every pod of the job mounts) and the job's name, so only
the job's own pods can compute it; the token itself never crosses the wire, and each connection's
answer is bound to a fresh random challenge (a recorded answer cannot be replayed).

Protocol (wire.py framing): the server speaks first, {"op": "hello", "nonce": hex}; the client
answers {"op": "auth", "mac": hex(HMAC-SHA256(key, "reader" + nonce))} and sends its requests
right after, without waiting; a wrong or missing answer gets {"ok": false, "error":
"unauthorized: ..."} in place of the first reply, and the server closes the connection.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import Any

KEY_LABEL = b"tandem shard server v1/"
NONCE_BYTES = 16


def shard_key(token: str, job: str) -> bytes:
    """The HMAC key of job `job`'s shard servers; ValueError on an empty token (no key to derive)."""
    if not token:
        raise ValueError("the shard server needs the job's token (TANDEM_TOKEN) to derive its key; it is empty")
    return hmac.new(token.encode(), KEY_LABEL + job.encode(), hashlib.sha256).digest()


def challenge() -> bytes:
    """A fresh random challenge for one connection."""
    return secrets.token_bytes(NONCE_BYTES)


def answer(key: bytes, nonce: bytes) -> str:
    """What a reader holding `key` answers to `nonce`."""
    return hmac.new(key, b"reader" + nonce, hashlib.sha256).hexdigest()


def refusal(key: bytes, nonce: bytes, msg: dict[str, Any]) -> str | None:
    """None when `msg` (the client's first message) answers `nonce` with `key`, else why not."""
    mac = msg.get("mac")
    if msg.get("op") != "auth" or not isinstance(mac, str):
        return f"unauthorized: the first message must answer the shard server's challenge, not {msg.get('op')!r}"
    if not hmac.compare_digest(mac, answer(key, nonce)):
        return "unauthorized: wrong key (the reader does not carry this job's token)"
    return None
