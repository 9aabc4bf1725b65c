"""A hybrid pod's rollout uses exactly its trainer's GPUs (`spec.gpuAllocation: devicePlugin`).

Role: the device plugin gives the GPUs to the trainer container alone; the rollout container gets
NVIDIA_VISIBLE_DEVICES=all (`tandem.operator.manifests.gpu_sharing`), so it sees every GPU of the node. The
trainer's entry writes the UUIDs it was given (NVIDIA_VISIBLE_DEVICES as the device plugin sets it in
its container, else `nvidia-smi -L`) to TANDEM_GPU_IDS_FILE in an emptyDir both mount (`publish`);
the rollout's entry waits for the file (`wait_for`: meanwhile it answers GET /health on its port,
because the kubelet starts the trainer only once the rollout, a native sidecar, passes its
startupProbe) and sets CUDA_VISIBLE_DEVICES to those GPUs' indices before CUDA starts (`adopt`).
Callers: `python -m tandem.sidecars.trainer` and `python -m tandem.sidecars.rollout`.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tandem.sidecars.gpu import NoUsableGpu

log = logging.getLogger(__name__)
UUID = re.compile(r"GPU-[0-9A-Fa-f-]{8,}")


def nvidia_smi(*args: str) -> str:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return ""
    try:
        return subprocess.run([smi, *args], capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def trainer_ids(environ: Mapping[str, str] = os.environ, listing: Callable[[], str] = lambda: nvidia_smi("-L")
                ) -> list[str]:
    """UUIDs of the GPUs this container was given: NVIDIA_VISIBLE_DEVICES when it names them (the
    device plugin's default), else those `nvidia-smi -L` lists."""
    ids = UUID.findall(environ.get("NVIDIA_VISIBLE_DEVICES", ""))
    return ids or UUID.findall(listing())


def publish(path: Path, ids: list[str]) -> None:
    """Write the trainer's GPU UUIDs, one per line, atomically (the rollout polls for the file)."""
    if not ids:
        raise NoUsableGpu("the trainer cannot tell which GPUs it was given (NVIDIA_VISIBLE_DEVICES names no GPU "
                          "UUID and nvidia-smi -L lists none), so the rollout cannot share them")
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(f"{i}\n" for i in ids))
    tmp.replace(path)
    log.info("GPUs shared with the rollout: %s", ", ".join(ids))


class _Waiting(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        ok = self.path.split("?")[0] == "/health"
        body = b'{"phase": "waiting for the trainer\'s GPUs"}' if ok else b"{}"
        self.send_response(200 if ok else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass


def wait_for(path: Path, *, port: int | None = None, poll_s: float = 0.2) -> list[str]:
    """The trainer's GPU UUIDs, once its file exists; GET /health answers 200 on `port` meanwhile."""
    server = None
    if port is not None:
        server = ThreadingHTTPServer(("", port), _Waiting)
        threading.Thread(target=server.serve_forever, name="gpu-wait-health", daemon=True).start()
    log.info("waiting for the trainer's GPU UUIDs in %s", path)
    try:
        while not path.exists():
            time.sleep(poll_s)
        return UUID.findall(path.read_text())
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()


def cuda_visible_devices(ids: list[str], listing: str) -> str:
    """Indices, in `nvidia-smi --query-gpu=index,uuid` order, of the GPUs `ids` names."""
    rows = (line.split(",", 1) for line in listing.splitlines() if "," in line)
    index = {uuid.strip(): i.strip() for i, uuid in rows}
    missing = [u for u in ids if u not in index]
    if missing or not ids:
        raise NoUsableGpu(
            f"the trainer's GPUs {', '.join(missing or ids) or '(none)'} are not visible in the rollout container "
            f"(it sees {', '.join(index.values()) or 'no GPU'}): the NVIDIA container toolkit ignored "
            "NVIDIA_VISIBLE_DEVICES=all, as hardened toolkits do in unprivileged containers; use "
            "spec.gpuAllocation: dra on this cluster")
    return ",".join(index[u] for u in ids)


def adopt(ids: list[str], listing: str | None = None) -> str:
    """Restrict this process (and vLLM's workers) to the GPUs `ids` names, before CUDA starts."""
    if listing is None:
        listing = nvidia_smi("--query-gpu=index,uuid", "--format=csv,noheader")
    visible = cuda_visible_devices(ids, listing)
    os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # nvidia-smi's order, so its indices are CUDA's
    os.environ["CUDA_VISIBLE_DEVICES"] = visible
    log.info("using the trainer's GPUs %s (CUDA_VISIBLE_DEVICES=%s)", ", ".join(ids), visible)
    return visible
