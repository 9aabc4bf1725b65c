"""Serving a sidecar's HTTP app (uvicorn) in a background thread, ready before anyone is told.

Role: both sidecars advertise their address in etcd only once the server accepts connections,
so the driver never calls a port that is not listening yet. Callers: the rollout entry point
(control + generation API) and the trainer's start (`loop.start`: its checkpoint-engine API).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import uvicorn


class ServerError(RuntimeError):
    pass


def start_server(app: Any, port: int, name: str, timeout: float = 60.0) -> tuple[uvicorn.Server, threading.Thread]:
    """Start `app` on 0.0.0.0:`port` in a daemon thread; return once it is listening."""
    server = uvicorn.Server(uvicorn.Config(app, host="0.0.0.0", port=port, log_level="warning"))  # noqa: S104
    thread = threading.Thread(target=server.run, name=name, daemon=True)  # no signal handlers off main
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise ServerError(f"{name}: HTTP server did not start on port {port}")
        time.sleep(0.02)
    return server, thread


def wait_until_stopped(server: uvicorn.Server, thread: threading.Thread) -> None:
    """Block while the server runs; on any exit (SIGTERM → SystemExit) ask it to stop."""
    try:
        while thread.is_alive():
            thread.join(0.5)
    finally:
        server.should_exit = True
