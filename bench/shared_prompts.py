"""Benchmark (not a test): a GRPO train step with each group's prompt packed once per row
(`trainer.sharePrompts`, the default) against one copy per completion, side by side in one run.

The model is SmolLM2-135M-Instruct (`tandem models fetch smollm2-135m`, cached) in the Megatron
engine on this CPU, the samples are shaped like examples/smollm2-grpo.yaml's iterations: 8 chat
prompts of the arith task (ChatML template with SmolLM2's default system prompt: ~31 tokens) x
groupSize 4 completions of --completion tokens (random ids; the cost does not depend on them),
globalBatchSize 32, microBatchSize 8. Each variant runs --steps steps, alternating A/B so that load
changes hit both; the first step of each is a warm-up. Prints tokens computed per step, seconds per
step (median) and the ratio.

Run: /root/.cache/tandem/venv/bin/python bench/shared_prompts.py [--steps 4] [--completion 37] [--group 4]

Measured here (2 cores, AVX2, torch 2.13 CPU, 2026-11-25, 3 steps each after a warm-up): whole 32 rows x
81 = 2424 tokens computed, 17.80 s per step (median); shared 8 rows x 193 = 1512 tokens, 12.33 s: 1.44x.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / r) for r in ("operator", "sidecars", "spec", "checkpoint_engine")]


def samples(tokenizer: Any, group: int, completion: int) -> list[Any]:
    import torch

    from tandem.sidecars.algorithms.algorithm_interface import Sample

    rows = [json.loads(x) for x in (ROOT / "examples" / "arith" / "train.jsonl").read_text().splitlines()[:8]]
    gen = torch.Generator().manual_seed(0)
    out = []
    for g, row in enumerate(rows):
        prompt = list(tokenizer.apply_chat_template(row["messages"], add_generation_prompt=True, tokenize=True,
                                                    return_dict=True)["input_ids"])
        for k in range(group):
            n = max(1, completion + (k % 3) - 1)  # lengths vary a little within a group, as sampled ones do
            out.append(Sample(prompt, torch.randint(10, 40000, (n,), generator=gen).tolist(), group=g,
                              reward=float(k % 2), rollout_logprobs=[-1.0] * n))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=4, help="timed steps per variant (after one warm-up)")
    ap.add_argument("--completion", type=int, default=37, help="completion tokens (smollm2 run: ~37)")
    ap.add_argument("--group", type=int, default=4)
    args = ap.parse_args(argv)

    import torch
    from transformers import AutoTokenizer

    from tandem.cli import pretrained
    from tandem.sidecars.algorithms.algorithm_interface import row_budget
    from tandem.sidecars.algorithms.grpo import GRPO
    from tandem.sidecars.trainer.engines import cpu_compat
    from tandem.sidecars.trainer.engines.heads import shift_to_labels
    from tandem.sidecars.trainer.engines.megatron_engine import MegatronEngine

    cpu_compat.apply()
    model = pretrained.fetch("smollm2-135m", progress=print)
    batch_samples = samples(AutoTokenizer.from_pretrained(model), args.group, args.completion)
    engine = MegatronEngine.from_hf(model, lr=1e-6, seed=0, micro_batch_size=8)
    variants = {}
    for share in (False, True):
        algo = GRPO(kl_coef=0.0, share_prompts=share)
        batch = algo.prepare(batch_samples, row_budget(batch_samples, share_prompts=share, hidden=engine.shape.hidden))

        def loss(out: torch.Tensor, mb: Any, algo: GRPO = algo) -> tuple[torch.Tensor, dict[str, float]]:
            return algo.loss(shift_to_labels(out), mb)

        variants["shared" if share else "whole"] = (batch, loss)
    times: dict[str, list[float]] = {k: [] for k in variants}
    for step in range(args.steps + 1):
        for name, (batch, loss) in variants.items():
            t = time.perf_counter()
            engine.train_step(batch, loss, reduction="sum")
            if step:  # step 0 warms both up
                times[name].append(time.perf_counter() - t)
        print(f"step {step}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items() if v), flush=True)
    print(f"{len(batch_samples)} samples ({len(batch_samples) // args.group} prompts x {args.group}), "
          f"{torch.get_num_threads()} threads")
    for name, (batch, _) in variants.items():
        tokens = int((batch.segment_ids > 0).sum())
        print(f"  {name:<7} rows {batch.num_rows:>3} x {batch.row_length:>4}  tokens computed {tokens:>5}  "
              f"step {statistics.median(times[name]):.2f} s (median of {len(times[name])})")
    ratio = statistics.median(times["whole"]) / statistics.median(times["shared"])
    print(f"shared prompts: {ratio:.2f}x faster per train step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
