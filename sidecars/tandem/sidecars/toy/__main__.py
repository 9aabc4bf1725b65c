"""`python -m tandem.sidecars.toy OUT_DIR`: build (or reuse) the demo's task and model.

Role: command-line entry of `toy.build.build_toy`; prints the paths and the warm-up metrics as
JSON. Callers: people, `make toy-demo` (docs/benchmarks.md), scripts.
"""

from __future__ import annotations

import argparse
import json
import sys

from tandem.sidecars.toy.build import ToyParams, build_toy


def main(argv: list[str] | None = None) -> int:
    defaults = ToyParams()
    parser = argparse.ArgumentParser(prog="python -m tandem.sidecars.toy", description=__doc__)
    parser.add_argument("out_dir")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--warmup-steps", type=int, default=defaults.warmup_steps)
    parser.add_argument("--max-operand", type=int, default=defaults.max_operand)
    parser.add_argument("--target-accuracy", type=float, default=defaults.target_accuracy,
                        help="stop the warm-up once greedy accuracy reaches this (0: run all steps)")
    parser.add_argument("--family", default=defaults.family, choices=("qwen2", "gemma", "mixtral"),
                        help="the model's architecture (mixtral: the toy mixture-of-experts)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads for the warm-up")
    args = parser.parse_args(argv)
    paths = build_toy(args.out_dir, seed=args.seed, warmup_steps=args.warmup_steps,
                      max_operand=args.max_operand, target_accuracy=args.target_accuracy,
                      threads=args.threads, family=args.family)
    print(json.dumps({"model": str(paths.model_dir), "train": str(paths.train_path),
                      "test": str(paths.test_path), "manifest": str(paths.manifest_path),
                      "metrics": paths.metrics}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
