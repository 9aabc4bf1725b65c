"""A trainer engine in bf16 on one GPU, in a process of its own: load, train, offload, onload, train again,
with torch.cuda.max_memory_allocated and memory_allocated per phase. Caller: test_gpu_path.py.
Usage: python memory_worker.py MODEL_DIR OUT_JSON [megatron|hf]"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "trainer"))  # dist_worker (a script sees its folder, not the cwd)


def main(model_dir: str, out: str, engine_name: str = "megatron") -> None:
    from dist_worker import fixed_batch, nll_loss

    from tandem.sidecars.trainer.engines.hf_engine import HFEngine
    from tandem.sidecars.trainer.engines.megatron_engine import MegatronEngine

    phases: dict[str, dict[str, float]] = {}
    mib = float(1 << 20)

    def phase(name: str, work: Any) -> Any:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        result = work()
        torch.cuda.synchronize()
        # cuBLAS/cuBLASLt workspaces (32 MiB a handle and stream on Hopper) stay allocated in the caching
        # allocator, empty_cache or not, and are no engine state: cleared before the reading, as torch's own
        # leak checks do (they come back at the next matmul)
        with_workspaces = torch.cuda.memory_allocated()
        torch._C._cuda_clearCublasWorkspaces()
        phases[name] = {"peak_mib": torch.cuda.max_memory_allocated() / mib,
                        "allocated_mib": torch.cuda.memory_allocated() / mib,
                        "cublas_workspaces_mib": (with_workspaces - torch.cuda.memory_allocated()) / mib}
        return result

    build = HFEngine.from_hf if engine_name == "hf" else MegatronEngine.from_hf
    engine: Any = phase("load", lambda: build(model_dir, lr=1e-2, seed=0, dtype=torch.bfloat16))
    losses = phase("train", lambda: [engine.train_step(fixed_batch(), nll_loss)["loss"] for _ in range(2)])
    phase("offload", engine.offload)
    phase("onload", engine.onload)
    losses += phase("train_again", lambda: [engine.train_step(fixed_batch(), nll_loss)["loss"]])
    dtypes = sorted({str(p.dtype) for _, p in engine.named_parameters()})
    with open(out, "w") as f:
        json.dump({"phases": phases, "losses": losses, "dtypes": dtypes}, f)


if __name__ == "__main__":
    main(*sys.argv[1:4])
