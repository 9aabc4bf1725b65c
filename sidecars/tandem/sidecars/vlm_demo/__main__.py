"""Write the VLM demo's picture task: `python -m tandem.sidecars.vlm_demo DIR [--train N] [--test N]`.

Role: the files `examples/vlm-grpo.yaml` (`make vlm-demo`) reads, written deterministically by shapes.py: DIR/
train.jsonl (generator seed 1) and DIR/test.jsonl (seed 2, disjoint pictures) with their pictures under DIR/images/,
and DIR/test-blind.jsonl: the test questions with the picture taken out (a model that answers them above chance,
1 in 6, answers without looking). Caller: the Makefile's vlm-demo target and bench/vlm_demo.py.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tandem.sidecars.vlm_demo import shapes

TRAIN_SEED, TEST_SEED = 1, 2


def write(root: Path, train: int = 512, test: int = 96) -> dict[str, Path]:
    """The three files under `root` (written again each time: the same bytes for the same counts)."""
    out = {"train": shapes.write_split(root, "train", train, TRAIN_SEED),
           "test": shapes.write_split(root, "test", test, TEST_SEED)}
    blind = []
    for line in out["test"].read_text().splitlines():
        row = json.loads(line)
        for message in row["messages"]:
            if isinstance(message["content"], list):
                message["content"] = " ".join(p["text"] for p in message["content"] if p.get("type") == "text")
        blind.append(json.dumps(row))
    out["blind"] = root / "test-blind.jsonl"
    out["blind"].write_text("\n".join(blind) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", type=Path)
    ap.add_argument("--train", type=int, default=512)
    ap.add_argument("--test", type=int, default=96)
    args = ap.parse_args(argv)
    for name, path in write(args.dir, args.train, args.test).items():
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
