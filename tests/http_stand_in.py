"""A real HTTP server on loopback standing in for a rollout sidecar's API, for tests of the driver's side.

Tests of the trainer's rollout client (tests/trainer/test_rollout_client.py) and of the driver's stall watch
(tests/trainer/test_driver_stall_watch.py) talk to a real socket, as the driver does in a pod; their handlers
say what the stand-in answers, `JsonHandler.answer` writes it, and `serve` starts the server in a daemon thread.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class JsonHandler(BaseHTTPRequestHandler):
    """A handler that answers JSON and logs nothing (the requests would fill the test's output)."""

    def answer(self, body: dict[str, Any], status: int = 200) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


def serve(handler: type[BaseHTTPRequestHandler]) -> tuple[ThreadingHTTPServer, str]:
    """The server on a free loopback port, serving in a daemon thread, and its "host:port"."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"127.0.0.1:{server.server_address[1]}"
