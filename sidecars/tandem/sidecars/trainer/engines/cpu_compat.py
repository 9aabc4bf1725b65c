"""CPU compatibility layer that lets megatron-core run on a machine without a GPU.

Applied on every CPU trainer rank, whichever engine it builds (megatron or hf): by
`tandem.sidecars.trainer.rank.run_rank` before the loop starts, and again (idempotent) by
`common.start_process_group`, which both engines call when they start their process group (so an engine built
outside a trainer rank, in tests and benchmarks, gets it too); a no-op when ``torch.cuda.is_available()``.
The patches are what megatron-core needs; the hf engine (transformers + FSDP2) runs under them as well, which
is why `apply` builds torch's cache of device-aware factories from the original functions first
(transformers' `from_pretrained` relies on it). megatron-core assumes CUDA in a handful of places; this module
redirects each of them to the CPU:

* CUDA RNG state functions and ``torch.cuda.default_generators`` -> the CPU generator;
* ``torch.cuda.current_device()`` -> 0, and every CUDA device given to a tensor factory,
  ``Tensor.to``, ``Tensor.cuda`` or ``Module.cuda`` -> the CPU;
* ``Tensor.type()`` reports ``torch.cuda.*Tensor`` (megatron's optimizers compare these strings);
* streams, events, ``synchronize`` and ``empty_cache`` become no-ops.

A global ``TorchFunctionMode`` would be simpler but is disabled inside autograd's backward, so the
functions are wrapped one by one. :func:`apply` is idempotent.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.utils._device

_applied = False
_CPU = torch.device("cpu")
_FACTORIES = (
    "empty",
    "zeros",
    "ones",
    "full",
    "tensor",
    "as_tensor",
    "arange",
    "rand",
    "randn",
    "randint",
    "randperm",
    "empty_like",
    "zeros_like",
    "ones_like",
    "full_like",
    "rand_like",
    "randn_like",
    "empty_strided",
    "linspace",
    "eye",
    "tril_indices",
    "triu_indices",
)


def _is_cuda(device: object) -> bool:
    if isinstance(device, int) and not isinstance(device, bool):
        return True
    if isinstance(device, str):
        return device.startswith("cuda")
    return isinstance(device, torch.device) and device.type == "cuda"


def _cpu_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    if _is_cuda(kwargs.get("device")):
        kwargs["device"] = _CPU
    if kwargs.get("pin_memory"):
        kwargs["pin_memory"] = False
    return kwargs


def _wrap_factory(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **_cpu_kwargs(kwargs))

    return wrapper


def _wrap_to(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        args = tuple(_CPU if _is_cuda(a) else a for a in args)
        return fn(self, *args, **_cpu_kwargs(kwargs))

    return wrapper


def _tensor_cuda(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    return self


def _module_cuda(self: torch.nn.Module, *args: Any, **kwargs: Any) -> torch.nn.Module:
    return self


def _wrap_type(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        result = fn(self, *args, **kwargs)
        if not args and not kwargs and isinstance(result, str) and self.device.type == "cpu":
            return result.replace("torch.", "torch.cuda.", 1)
        return result

    return wrapper


class _Stream:
    """Stand-in for torch.cuda.Stream / Event: every operation completes at once."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.device = _CPU

    def __getattr__(self, name: str) -> Callable[..., Any]:
        return lambda *args, **kwargs: None

    def query(self) -> bool:
        return True

    def elapsed_time(self, other: object) -> float:
        return 0.0


def _noop() -> Callable[..., None]:
    def noop(*args: Any, **kwargs: Any) -> None:
        return None

    return noop


def apply() -> bool:
    """Install the CPU redirections; returns True when they are (or already were) active.

    Does nothing and returns False when a GPU is present.
    """
    global _applied
    if _applied:
        return True
    if torch.cuda.is_available():
        return False
    # torch caches the list of factory functions that honour `with torch.device(...)`; it must be
    # built from the original functions, or transformers' from_pretrained silently breaks.
    torch.utils._device._device_constructors()
    for name in _FACTORIES:
        setattr(torch, name, _wrap_factory(getattr(torch, name)))
    torch.Tensor.to = _wrap_to(torch.Tensor.to)  # type: ignore[method-assign]
    torch.Tensor.cuda = _tensor_cuda  # type: ignore[method-assign]
    torch.Tensor.type = _wrap_type(torch.Tensor.type)  # type: ignore[method-assign]
    torch.nn.Module.cuda = _module_cuda  # type: ignore[method-assign]

    # Each patched attribute gets its own function object: torch._dynamo keeps one rule per object.
    patches: dict[str, Callable[..., Any]] = {
        "current_device": lambda: 0,
        "device_count": lambda: 1,
        "get_rng_state": lambda device=None: torch.get_rng_state(),
        "set_rng_state": lambda state, device=None: torch.set_rng_state(state),
        "manual_seed": lambda seed: torch.default_generator.manual_seed(seed),
        "manual_seed_all": lambda seed: torch.default_generator.manual_seed(seed),
        "_lazy_call": lambda callback, **kwargs: callback(),
        "current_stream": lambda *args, **kwargs: _Stream(),
        "default_stream": lambda *args, **kwargs: _Stream(),
        "stream": contextlib.nullcontext,
        "device": contextlib.nullcontext,
        "memory_allocated": lambda *args, **kwargs: 0,
        "max_memory_allocated": lambda *args, **kwargs: 0,
        "memory_reserved": lambda *args, **kwargs: 0,
        # device_count is 1 above; with PYTORCH_NVML_BASED_CUDA_CHECK=1 (vLLM sets it) torch's
        # is_available() would then say True and optimizers would query a CUDA stream.
        "is_available": lambda: False,
    }
    for name in ("set_device", "synchronize", "empty_cache", "_lazy_init"):
        patches[name] = _noop()
    cuda: Any = torch.cuda
    for name, value in patches.items():
        setattr(cuda, name, value)
    cuda.random.get_rng_state = lambda device=None: torch.get_rng_state()
    cuda.random.set_rng_state = lambda state, device=None: torch.set_rng_state(state)
    cuda.random.manual_seed = lambda seed: torch.default_generator.manual_seed(seed)
    cuda.default_generators = (torch.default_generator,)
    cuda.Stream = cuda.Event = _Stream
    cuda.nvtx.range_push, cuda.nvtx.range_pop = _noop(), _noop()
    _applied = True
    return True
