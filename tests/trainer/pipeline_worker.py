"""The trainer half of tests/rollout_engine/test_trainer_to_vllm.py, run in a process of its own.

Megatron's parallel state and the CPU compatibility layer (which patches torch globally) are per
process; vLLM forks its engine process from the test process, so the trainer runs here instead.
For each case of the spec file (a JSON list of {model_dir, shm_root, job, prompts, max_new_tokens,
out, and optionally dtype}) it builds the real `MegatronEngine.from_hf`, and for version 0 (the loaded weights) and
version 1 (after `STEPS` training steps) writes `engine.export_hf()` as a published version with
the checkpoint engine's own writer, then saves what the engine itself computes for the prompts:
full logits and greedy continuations. Usage: python pipeline_worker.py SPEC_JSON
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch

STEPS = 2  # optimizer steps between version 0 and version 1


def one_row(ids: list[int]) -> dict[str, torch.Tensor]:
    tensor = torch.tensor([ids])
    return {"input_ids": tensor, "segment_ids": torch.ones_like(tensor)}


def run_case(case: dict[str, Any]) -> None:
    from dist_worker import fixed_batch, nll_loss

    from tandem.checkpoint_engine.versions import version_writer
    from tandem.sidecars.trainer.engines.megatron_engine import MegatronEngine

    dtype = getattr(torch, case.get("dtype", "float32"))  # bfloat16: Megatron's Float16Module, bf16 export
    engine = MegatronEngine.from_hf(case["model_dir"], lr=1e-2, seed=0, dtype=dtype)
    prompts: list[list[int]] = case["prompts"]
    result: dict[str, Any] = {"local_names": [n for n, _ in engine.named_parameters()]}
    for version in (0, 1):
        if version == 1:
            result["losses"] = [engine.train_step(fixed_batch(), nll_loss)["loss"] for _ in range(STEPS)]
        wrote = version_writer.write_version(Path(case["shm_root"]), case["job"], version, engine.export_hf())
        result[f"v{version}"] = {
            "path": str(wrote.path),
            "logits": [engine.logits(one_row(p))[0] for p in prompts],
            "greedy": [engine.greedy_generate(p, case["max_new_tokens"]) for p in prompts],
        }
    torch.save(result, case["out"])


def main(spec_file: str) -> None:
    torch.set_num_threads(2)
    for case in json.loads(Path(spec_file).read_text()):
        run_case(case)


if __name__ == "__main__":
    main(sys.argv[1])
