"""Long-sequence benchmark: memory per token of one GRPO train step at 1k, 4k and 16k tokens per row.

Each case runs in a fresh process (real megatron-core on CPU, one rank): SmolLM2-135M-Instruct
(`tandem models fetch smollm2-135m`: 30 layers, hidden 576, 9 heads, 3 KV heads) trains one step
on one packed row of the given length (16 samples of equal length sharing the row), through the
dense-mask attention (Megatron's, [heads, len, len] scores kept for the backward) or per-sample
fused attention (`segment_attention`: memory linear in the row), with and without activation
recompute (trainer.activationCheckpointing). Reported: the process's peak RSS over its RSS after the
engine is built (weights, gradients and Adam's state are there), per token of the row; and the step's
seconds (noisy on 2 shared cores: not a target). A case whose estimate exceeds --max-gib is skipped
and said so: the dense path's probabilities, or the memory per token measured at a shorter row.

Measured 2026-11-26 (2 cores; one step per case, peak RSS growth over the built engine, KiB per token):
       len  attention  recompute  peak growth MiB  KiB/token  step s
      1024  dense      no                    3450       3450    14.5
      1024  dense      yes                    591        591    20.6
      1024  segments   no                    1860       1860     9.7
      1024  segments   yes                    468        468    12.2
      4096  dense      no         skipped: ~17 GiB of attention probabilities
      4096  dense      yes                   3634        887   204.2
      4096  segments   no                    8246       2061    36.1
      4096  segments   yes                   1219        305    64.7
     16384  dense      either     skipped: ~270 GiB (no recompute), ~9 GiB of one layer's scores (recompute)
     16384  segments   no         skipped: ~32 GiB by the 4k row's memory per token
     16384  segments   yes                   2434        152   330.1
Per-sample attention with recompute grows linearly (1.2 GiB at 4k, 2.4 GiB at 16k); the dense mask's scores
grow with the square of the row. The 4k dense + recompute case ran alone (`--case`), after the rule that skips
dense cases counted one layer's scores under recompute, not every layer's.

Not a test. Run (a few minutes on 2 cores; the 16k case ~6 minutes, the 4k dense one ~4):
    /root/.cache/tandem/venv/bin/python bench/long_sequences.py [--lengths 1024,4096,16384] [--out DIR]
It prints a table and writes DIR/long_sequences.json (default DIR: /tmp/tandem-bench/long_sequences).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SAMPLES_PER_ROW = 16


def dense_scores_gib(length: int, heads: int = 9, layers: int = 30) -> float:
    """What the dense path keeps for the backward: fp32 probabilities [heads, len, len] per layer (with
    recompute, one layer's at a time: pass layers=1)."""
    return 4 * heads * length * length * layers / 2**30


def case(model: str, length: int, path: str, recompute: bool) -> dict[str, Any]:
    """One train step in this process; peak RSS growth in MiB and seconds."""
    import torch

    from tandem.sidecars.algorithms.algorithm_interface import Sample
    from tandem.sidecars.algorithms.grpo import GRPO
    from tandem.sidecars.trainer.engines.heads import shift_to_labels
    from tandem.sidecars.trainer.engines.megatron_engine import MegatronEngine

    torch.set_num_threads(max(1, len(os.sched_getaffinity(0))))
    engine = MegatronEngine.from_hf(model, lr=1e-6, seed=0, recompute=recompute)
    engine.dense_max_tokens = 1 << 30 if path == "dense" else 0
    each = length // SAMPLES_PER_ROW
    gen = torch.Generator().manual_seed(0)
    samples = [Sample(torch.randint(10, 40000, (each // 4,), generator=gen).tolist(),
                      torch.randint(10, 40000, (each - each // 4,), generator=gen).tolist(), group=i // 4,
                      reward=float(i % 2)) for i in range(SAMPLES_PER_ROW)]
    algo = GRPO(kl_coef=0.0)
    batch = algo.prepare(samples, length)
    assert batch.num_rows == 1

    def loss_fn(out: torch.Tensor, mb: Any) -> tuple[torch.Tensor, dict[str, float]]:
        return algo.loss(shift_to_labels(out), mb)

    warm = algo.prepare([Sample(s.prompt_ids[:8], s.completion_ids[:8], s.group, s.reward) for s in samples[:4]], 64)
    engine.train_step(warm, loss_fn, micro_batch_size=1, reduction="sum")  # Adam's state, buffers: a short step
    base = rss_mib()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t = time.perf_counter()
    engine.train_step(batch, loss_fn, micro_batch_size=1, reduction="sum")
    seconds = time.perf_counter() - t
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"length": length, "path": path, "recompute": recompute, "seconds": seconds,
            "peak_growth_mib": max(peak, before) - base, "tokens": int(batch.segment_ids.ne(0).sum())}


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", default="1024,4096,16384")
    ap.add_argument("--max-gib", type=float, default=12.0, help="skip cases whose dense scores would exceed this")
    ap.add_argument("--out", type=Path, default=Path("/tmp/tandem-bench/long_sequences"))
    ap.add_argument("--case", help=argparse.SUPPRESS)  # internal: run one case, print its JSON
    args = ap.parse_args(argv)
    if args.case:
        model, length, path, recompute = args.case.split(",")
        print(json.dumps(case(model, int(length), path, recompute == "1")))
        return 0
    from tandem.cli import pretrained

    model = str(pretrained.fetch("smollm2-135m"))
    args.out.mkdir(parents=True, exist_ok=True)
    results: list[dict[str, Any]] = []
    per_token: dict[tuple[str, bool], float] = {}  # MiB per token measured at a shorter length
    print(f"{'len':>6} {'attention':>9} {'recompute':>9} {'peak growth MiB':>15} {'KiB/token':>9} {'step s':>7}")
    for length in [int(x) for x in args.lengths.split(",")]:
        for path in ("dense", "segments"):
            for recompute in (False, True):
                scores = dense_scores_gib(length, layers=1 if recompute else 30)
                if path == "dense" and scores > args.max_gib:
                    print(f"{length:>6} {path:>9} {str(recompute):>9}  skipped: ~{scores:.0f} GiB "
                          "of attention probabilities", flush=True)
                    continue
                guess = per_token.get((path, recompute), 0.0) * length / 1024
                if guess > args.max_gib:
                    print(f"{length:>6} {path:>9} {str(recompute):>9}  skipped: ~{guess:.0f} GiB by the shorter "
                          "row's memory per token", flush=True)
                    continue
                proc = subprocess.run([sys.executable, __file__, "--case", f"{model},{length},{path},"
                                       f"{int(recompute)}"], capture_output=True, text=True, cwd=ROOT, check=False)
                if proc.returncode != 0:
                    print(f"{length:>6} {path:>9} {str(recompute):>9}  failed: {proc.stderr.strip()[-300:]}",
                          flush=True)
                    continue
                r = json.loads(proc.stdout.strip().splitlines()[-1])
                results.append(r)
                per_token[(path, recompute)] = r["peak_growth_mib"] / r["tokens"]
                print(f"{length:>6} {path:>9} {str(recompute):>9} {r['peak_growth_mib']:>15.0f} "
                      f"{r['peak_growth_mib'] * 1024 / r['tokens']:>9.1f} {r['seconds']:>7.1f}", flush=True)
    (args.out / "long_sequences.json").write_text(json.dumps(results, indent=2))
    print(f"wrote {args.out / 'long_sequences.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
