"""Bytes of a vision-language model's versions with its tower frozen and without: whole, and as the cross-pod
delta a pod holding the previous version receives.

Role: trainer.freeze leaves a VLM's parts out of the optimizer; every version still carries the whole model (the
shared-memory layout, the rollout's in-place load), but across pods a version travels as a delta against the one
the receiver holds (versions/delta.py), in which an unchanged tensor costs almost nothing. This bench measures
that on the demo's LLaVA (`tandem models fetch llava-smollm2`; `--model` for another): one GRPO step of the hf
engine on 8 picture prompts x 4 random completions, frozen as each row says, then both versions (before and after
the step, bf16 as the trainer publishes on GPUs, and fp32) written with the real version writer and each shard
delta-encoded against the previous version. Prints one table (bytes, the tower's share of the model, the delta
with and without freezing) and writes bench/results/vlm_freeze.json.
    python bench/vlm_freeze.py [--model DIR]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / r) for r in ("operator", "sidecars", "spec", "checkpoint_engine")]
ROWS = {"nothing frozen": (), "tower frozen": ("visionTower",), "tower and projector frozen": ("visionTower",
                                                                                                "projector")}


def samples(model: Path, root: Path) -> list[Any]:
    from transformers import AutoProcessor

    from tandem.sidecars.algorithms.algorithm_interface import Sample
    from tandem.sidecars.vlm_demo import shapes, warmup

    processor = AutoProcessor.from_pretrained(model)
    rng = random.Random(0)
    out = []
    for g in range(8):
        pic = shapes.render(rng)
        text = processor.apply_chat_template(warmup.messages(pic.question), add_generation_prompt=True)
        inputs = processor(images=[pic.image], text=text, return_tensors="pt")
        for _ in range(4):
            out.append(Sample(prompt_ids=inputs["input_ids"][0].tolist(), group=g, reward=rng.random(),
                              completion_ids=[rng.randrange(100, min(5000, len(processor.tokenizer) - 1))
                                              for _ in range(6)],
                              images=tuple(inputs["pixel_values"])))
    return out


def step(model: Path, frozen: tuple[str, ...], batch: list[Any]) -> tuple[dict[str, torch.Tensor], ...]:
    from tandem.sidecars.algorithms.algorithm_interface import row_budget
    from tandem.sidecars.algorithms.grpo import GRPO
    from tandem.sidecars.trainer.engines.heads import shift_to_labels
    from tandem.sidecars.trainer.engines.hf_engine import HFEngine

    engine = HFEngine.from_hf(model, lr=1e-5, frozen=frozen)
    before = {k: v.detach().clone() for k, v in engine.export_hf()}
    algo = GRPO(kl_coef=0.0)
    packed = algo.prepare(batch, row_budget(batch))
    engine.train_step(packed, lambda out, mb: algo.loss(shift_to_labels(out), mb), micro_batch_size=8)
    after = {k: v.detach().clone() for k, v in engine.export_hf()}
    return before, after


def delta_bytes(root: Path, base: dict[str, torch.Tensor], new: dict[str, torch.Tensor],
                dtype: torch.dtype) -> tuple[int, int]:
    """(bytes of the new version, bytes of its delta against base), written as the publisher writes them."""
    from tandem.checkpoint_engine.versions import delta, version_writer

    def cast(state: dict[str, torch.Tensor]) -> list[tuple[str, torch.Tensor]]:
        return [(k, v.to(dtype) if v.is_floating_point() else v) for k, v in state.items()]

    b = version_writer.write_version(root, "freeze", 1, cast(base), shard_bytes=256 << 20)
    n = version_writer.write_version(root, "freeze", 2, cast(new), shard_bytes=256 << 20)
    bs, ns = delta.open_shards(b.path, b.index), delta.open_shards(n.path, n.index)
    sent = sum(len(delta.encode(n.index, i, ns[i], b.index, bs)) for i in range(len(n.index.shards)))
    return n.index.total_bytes, sent


def main(argv: list[str] | None = None) -> int:
    from tandem.cli import pretrained

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=None)
    args = ap.parse_args(argv)
    model = args.model or pretrained.fetch("llava-smollm2", progress=lambda m: print(m, flush=True))
    result: dict[str, Any] = {"model": str(model), "rows": {}}
    with tempfile.TemporaryDirectory(prefix="vlm-freeze-") as tmp:
        batch = samples(model, Path(tmp))
        for name, frozen in ROWS.items():
            before, after = step(model, frozen, batch)
            tower = sum(v.numel() * v.element_size() for k, v in after.items() if ".vision_tower." in k)
            row: dict[str, Any] = {"tower_share": tower / sum(v.numel() * v.element_size() for v in after.values()),
                                   "tower_changed": any(not torch.equal(after[k], before[k]) for k in after
                                                        if ".vision_tower." in k)}
            for dtype in (torch.bfloat16, torch.float32):
                whole, sent = delta_bytes(Path(tmp) / name.replace(" ", "-") / str(dtype), before, after, dtype)
                row[str(dtype).removeprefix("torch.")] = {"version_bytes": whole, "delta_bytes": sent}
            result["rows"][name] = row
            print(name, json.dumps(row), flush=True)
    (ROOT / "bench" / "results" / "vlm_freeze.json").write_text(json.dumps(result, indent=2))
    print(f"\n{'':28s} {'version (bf16)':>15s} {'delta (bf16)':>13s} {'delta (fp32)':>13s}  tower share")
    for name, row in result["rows"].items():
        bf16, fp32 = row["bfloat16"], row["float32"]
        print(f"{name:28s} {bf16['version_bytes'] / 2**20:13.2f}Mi {bf16['delta_bytes'] / 2**20:11.2f}Mi "
              f"{fp32['delta_bytes'] / 2**20:11.2f}Mi  {row['tower_share']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
