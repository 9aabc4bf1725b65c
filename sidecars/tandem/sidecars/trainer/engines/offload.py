"""Move a trainer's parameters, gradients and optimizer state to host memory and back.

Called by :meth:`MegatronEngine.offload` / ``onload`` around the rollout phase. Works on tensor
*storages*: each distinct storage (a parameter, a DDP gradient buffer, an Adam moment, an fp32
master copy) is copied into a host buffer (pinned when a GPU is present) and then shrunk to zero
bytes; onload grows it back and copies the bytes in. Views into a storage (Megatron's DDP params
and grads are views into flat buffers) stay valid because the storage object is kept. On a GPU
this frees device memory; on a CPU the same copies run (and are timed) so that the phase costs
are measured.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import torch


class OffloadError(RuntimeError):
    """Offload/onload called in the wrong state."""


class HostOffloader:
    """Owns the host copies of a set of tensors' storages between ``offload`` and ``onload``."""

    def __init__(self, keep_host_buffers: bool = True) -> None:
        self._saved: list[tuple[torch.UntypedStorage, torch.Tensor]] = []
        # Host buffers kept after onload and reused by the next offload of the same storages:
        # allocating (and pinning) gigabytes each phase costs more than the copy itself.
        self._keep = keep_host_buffers
        self._cache: list[torch.Tensor] = []
        self.offloaded = False

    def _host_buffer(self, index: int, nbytes: int, pin: bool) -> torch.Tensor:
        if index < len(self._cache) and self._cache[index].numel() == nbytes:
            return self._cache[index]
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin)

    @staticmethod
    def _storages(tensors: Iterable[torch.Tensor]) -> list[torch.UntypedStorage]:
        seen: dict[int, torch.UntypedStorage] = {}
        for tensor in tensors:
            storage = tensor.untyped_storage()
            if storage.nbytes() and storage.data_ptr() not in seen:
                seen[storage.data_ptr()] = storage
        return list(seen.values())

    def offload(self, tensors: Iterable[torch.Tensor]) -> dict[str, float]:
        """Copy every storage behind ``tensors`` to host memory and release it."""
        if self.offloaded:
            raise OffloadError("already offloaded")
        start = time.perf_counter()
        pin = torch.cuda.is_available()
        nbytes = 0
        for index, storage in enumerate(self._storages(tensors)):
            host = self._host_buffer(index, storage.nbytes(), pin)
            host.copy_(
                torch.tensor([], dtype=torch.uint8, device=storage.device).set_(storage), non_blocking=pin
            )
            self._saved.append((storage, host))
            nbytes += storage.nbytes()
        if pin:
            torch.cuda.synchronize()
        for storage, _ in self._saved:
            storage.resize_(0)
        if pin:  # hand the freed blocks back to the driver so that vLLM can use them
            torch.cuda.empty_cache()
        self.offloaded = True
        seconds = time.perf_counter() - start
        return {
            "offload_seconds": seconds,
            "offload_bytes": float(nbytes),
            "offload_storages": float(len(self._saved)),
        }

    def onload(self) -> dict[str, float]:
        """Re-allocate each storage and copy its bytes back."""
        if not self.offloaded:
            raise OffloadError("not offloaded")
        start = time.perf_counter()
        nbytes = 0
        for storage, host in self._saved:
            storage.resize_(host.numel())
            view = torch.tensor([], dtype=torch.uint8, device=storage.device).set_(storage)
            view.copy_(host, non_blocking=host.is_pinned())
            nbytes += host.numel()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self._cache = [host for _, host in self._saved] if self._keep else []
        self._saved.clear()
        self.offloaded = False
        return {"onload_seconds": time.perf_counter() - start, "onload_bytes": float(nbytes)}


def optimizer_tensors(optimizer: Any) -> list[torch.Tensor]:
    """Master params and state tensors of a Megatron optimizer (chained or not)."""
    inner: list[Any] = []
    stack = [optimizer]
    while stack:
        opt = stack.pop()
        if hasattr(opt, "chained_optimizers"):
            stack.extend(opt.chained_optimizers)
        elif isinstance(opt, torch.optim.Optimizer):
            inner.append(opt)
        elif getattr(opt, "optimizer", None) is not None:
            stack.append(opt.optimizer)
    tensors: list[torch.Tensor] = []
    for opt in inner:
        for group in opt.param_groups:
            tensors.extend(group["params"])
        for state in opt.state.values():
            tensors.extend(v for v in state.values() if isinstance(v, torch.Tensor) and v.dim() > 0)
    return tensors
