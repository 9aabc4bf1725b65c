"""GPU engine benchmark: the Megatron and hf trainer engines in bf16 on one CUDA GPU, and the HF layout Megatron
exports read back by transformers on that GPU.

For each engine, in a process of its own: build from a model directory (SmolLM2-135M's shape by default,
with random weights: `--model DIR` reads config.json and the tokenizer files there, `--weights` keeps the
directory's own weights), 3 train steps on 8 rows x 512 tokens (4 samples of 128 per row, micro-batches of
2 rows), offload, onload, one more step. Reported per phase: seconds, torch.cuda.max_memory_allocated and
memory_allocated (MiB), and the losses (they must fall). Then the Megatron engine, trained 3 steps on 4
rows of 256 tokens, saves its version as a HF directory (`save_hf`), and transformers loads it on the GPU in
bf16 and in fp32: the mean and max |log p| difference per token between the engine and transformers.

Measured 2026-11-26 on one NVIDIA H200 (driver 580.159.04, torch 2.11.0+cu130, megatron-core 0.16.1,
transformers 5.17.0; random weights of SmolLM2-135M's shape, 134.5M parameters; two runs, on a warm and on a
fresh machine, with the same MiB):
    engine    load s, held MiB   train (3 steps) s, peak / held MiB   offload: held MiB   onload s   step s
    megatron  5.5-11.7, 1293     2.0-2.7, 4354 / 2394                 73                 0.05       0.46-0.59
    hf        0.3-8.3,   523     5.3-6.1, 3349 / 1627                 64                 0.03       0.72-0.83
Again 2026-11-28 on one H200 (same versions): the same MiB to the unit but hf's held 1632; load 9.3 / 7.6 s,
train 1.9 / 5.0 s, step 0.37 / 1.09 s (megatron / hf); export 0.0017 mean, 0.0157 max in bf16.
The losses fell in both (10.92 -> 9.97 and 9.96 over 4 steps at lr 1e-4). Offload leaves 3% of Megatron's
trained state on the GPU (bf16 weights, fp32 main copies, Adam: 2394 MiB -> 73) and onload brings it back in
0.05 s. Export: mean |d log p| 0.0017 (max 0.016) against transformers in bf16, 0.0032 (max 0.014) in fp32,
saved in 0.28 s. vLLM on CUDA (the rollout's half of the GPU path, tests/gpu) did not run there: its wheel
cannot reach that machine; scripts/gpu-check.sh runs it where PyPI can be reached.

Not a test; needs a CUDA GPU. Run: python bench/gpu_engines.py [--model DIR] [--weights] [--out DIR]
It writes DIR/gpu_engines.json (default DIR: /tmp/tandem-bench/gpu_engines).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
MIB = float(1 << 20)
sys.path.insert(0, str(ROOT / "tests" / "trainer"))  # dist_worker.nll_loss: the trainer tests' packed-sample NLL


def packed(rows: int, length: int, sample: int, seed: int) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, 49152, (rows, length), generator=torch.Generator().manual_seed(seed))
    segments = torch.arange(length).div(sample, rounding_mode="floor").add(1).repeat(rows, 1)
    return {"input_ids": ids, "segment_ids": segments}


def engine_phases(model: Path, name: str) -> dict[str, Any]:
    from dist_worker import nll_loss

    from tandem.sidecars.trainer.engines.hf_engine import HFEngine
    from tandem.sidecars.trainer.engines.megatron_engine import MegatronEngine

    phases: dict[str, dict[str, float]] = {}

    def phase(label: str, work: Callable[[], Any]) -> Any:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        t = time.perf_counter()
        result = work()
        torch.cuda.synchronize()
        phases[label] = {"s": round(time.perf_counter() - t, 3),
                         "peak_mib": round(torch.cuda.max_memory_allocated() / MIB),
                         "held_mib": round(torch.cuda.memory_allocated() / MIB)}
        print(name, label, phases[label], flush=True)
        return result

    build = HFEngine.from_hf if name == "hf" else MegatronEngine.from_hf
    engine = phase("load", lambda: build(model, lr=1e-4, seed=0, dtype=torch.bfloat16, micro_batch_size=2))
    batch = packed(8, 512, 128, 7)
    losses = phase("train", lambda: [engine.train_step(batch, nll_loss)["loss"] for _ in range(3)])
    phase("offload", engine.offload)
    phase("onload", engine.onload)
    losses += phase("step", lambda: [engine.train_step(batch, nll_loss)["loss"]])
    return {"phases": phases, "losses": losses}


def export_check(model: Path, out: Path) -> dict[str, Any]:
    from dist_worker import nll_loss
    from transformers import AutoModelForCausalLM

    from tandem.sidecars.trainer.engines.megatron_engine import MegatronEngine

    engine = MegatronEngine.from_hf(model, lr=1e-3, seed=0, dtype=torch.bfloat16, micro_batch_size=2)
    batch = packed(4, 256, 256, 3)
    losses = [engine.train_step(batch, nll_loss)["loss"] for _ in range(3)]
    mine = engine.token_logprobs(batch)[:, 1:]
    t = time.perf_counter()
    hf_dir = engine.save_hf(out / "export", model)
    result: dict[str, Any] = {"losses": losses, "save_s": round(time.perf_counter() - t, 2)}
    ids = batch["input_ids"].cuda()
    for dtype in (torch.bfloat16, torch.float32):
        hf = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=dtype).cuda().eval()
        with torch.no_grad():
            lp = torch.log_softmax(hf(ids).logits.float(), -1)[:, :-1].gather(-1, ids[:, 1:, None])[..., 0].cpu()
        diff = (lp - mine).abs()
        result[str(dtype)] = {"mean_abs": float(diff.mean()), "max_abs": float(diff.max())}
    print("export", result, flush=True)
    return result


def prepare(model: Path, weights: bool, out: Path) -> Path:
    """The model directory the engines build from: `model` itself, or its config and tokenizer with random
    weights of its shape (seed 0)."""
    if weights:
        return model
    from transformers import AutoConfig, AutoModelForCausalLM

    d = out / "model"
    d.mkdir(parents=True, exist_ok=True)
    for f in model.iterdir():
        if f.suffix in (".json", ".jinja", ".txt", ".model"):
            shutil.copy(f, d / f.name)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(d), dtype=torch.float32).save_pretrained(d)
    return d


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, default=Path.home() / ".cache/tandem/models/smollm2-135m")
    ap.add_argument("--weights", action="store_true", help="the directory's own weights (default: random)")
    ap.add_argument("--out", type=Path, default=Path("/tmp/tandem-bench/gpu_engines"))
    ap.add_argument("--case", help=argparse.SUPPRESS)  # one engine in this process (each runs in its own)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench/gpu_engines.py needs a CUDA GPU (torch.cuda.is_available() is False)")
    if args.case:
        result = export_check(args.model, args.out) if args.case == "export" else engine_phases(args.model, args.case)
        (args.out / f"{args.case}.json").write_text(json.dumps(result))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    model = prepare(args.model, args.weights, args.out)
    results: dict[str, Any] = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    for case in ("megatron", "hf", "export"):  # a process each: Megatron's process groups live per process
        subprocess.run([sys.executable, __file__, "--model", str(model), "--out", str(args.out), "--case", case],
                       check=True, cwd=ROOT)
        results[case] = json.loads((args.out / f"{case}.json").read_text())
    (args.out / "gpu_engines.json").write_text(json.dumps(results, indent=2))
    for name in ("megatron", "hf"):
        p, losses = results[name]["phases"], results[name]["losses"]
        print(f"{name:<9} load {p['load']['s']}s {p['load']['held_mib']} MiB | train {p['train']['s']}s peak "
              f"{p['train']['peak_mib']} held {p['train']['held_mib']} MiB | "
              f"offload held {p['offload']['held_mib']} MiB | "
              f"onload {p['onload']['s']}s | step {p['step']['s']}s | loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    e = results["export"]
    print(f"export: |d log p| vs transformers bf16 mean {e['torch.bfloat16']['mean_abs']:.4f} max "
          f"{e['torch.bfloat16']['max_abs']:.4f}; fp32 mean {e['torch.float32']['mean_abs']:.4f} max "
          f"{e['torch.float32']['max_abs']:.4f}; saved in {e['save_s']}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
