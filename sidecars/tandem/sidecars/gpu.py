"""Which device a sidecar runs on, decided by the spec alone: `gpusPerPod > 0` means CUDA or nothing.

Role: a job that asks for GPUs must never train or generate on the CPU because CUDA is missing (a
wrong driver, a device plugin that mounted nothing, a CPU torch): `require_cuda` raises `NoUsableGpu`
naming everything that tells why — `torch.cuda.is_available()`, the device count, the driver version
(nvidia-smi, else pynvml, else /proc/driver/nvidia/version), CUDA_VISIBLE_DEVICES and
NVIDIA_VISIBLE_DEVICES, torch's own CUDA build. `gpusPerPod: 0` runs on the CPU even where a GPU is
visible (`hide_gpus`, before torch initialises CUDA). Callers: the trainer's entry and `run_rank`,
the rollout's entry.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

MIN_DRIVER = "580"  # CUDA 13.x (torch 2.13.0+cu130): NVIDIA's minor-version-compatibility table


class NoUsableGpu(RuntimeError):
    """The spec asks for GPUs and this process has no usable CUDA device."""


def driver_version() -> str | None:
    """The NVIDIA kernel driver's version, from whichever of nvidia-smi, pynvml, /proc answers."""
    smi = shutil.which("nvidia-smi")
    if smi is not None:
        try:
            out = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                                 text=True, timeout=20, check=True).stdout.split()
            if out:
                return out[0]
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:  # noqa: S110 - not installed, or no driver behind it
        pass
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
    except OSError:
        return None
    words = text.split()
    return next((w for w in words if w[:1].isdigit() and "." in w), text.strip()[:80])


def describe() -> str:
    """One line of what this process sees: torch's CUDA, devices, driver and the visibility variables."""
    import torch

    build = torch.version.cuda
    driver = driver_version()
    parts = [
        f"torch.cuda.is_available() is {torch.cuda.is_available()}",
        f"torch.cuda.device_count() {torch.cuda.device_count()}",
        f"torch {torch.__version__} ({f'built for CUDA {build}' if build else 'a CPU-only build'})",
        f"NVIDIA driver {driver}" if driver else "no NVIDIA driver found (no nvidia-smi, no pynvml, no "
        "/proc/driver/nvidia/version: the container runtime mounted none)",
    ]
    for var in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"):
        parts.append(f"{var}={os.environ[var]!r}" if var in os.environ else f"{var} unset")
    return "; ".join(parts)


def require_cuda(gpus: int, role: str) -> None:
    """Raise NoUsableGpu unless `gpus` CUDA devices are usable here (gpus > 0)."""
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() >= gpus:
        return
    raise NoUsableGpu(
        f"spec.gpusPerPod is {gpus} but the {role} has no usable CUDA device, and it will not fall back to the "
        f"CPU: {describe()}. Give the pod GPUs with an NVIDIA driver >= {MIN_DRIVER} (torch's CUDA build), or "
        "set gpusPerPod: 0 for a CPU run.")


def hide_gpus() -> None:
    """gpusPerPod 0: run on the CPU even where CUDA devices are visible (before torch touches CUDA)."""
    os.environ["CUDA_VISIBLE_DEVICES"] = ""


def select(gpus: int, role: str) -> bool:
    """The device policy of a sidecar process: True on CUDA (checked), False on the CPU (GPUs hidden)."""
    if gpus == 0:
        hide_gpus()
        return False
    require_cuda(gpus, role)
    return True
