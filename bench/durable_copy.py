"""Durable checkpoint copies: what `checkpointEngine.persist` costs, side by side with a plain copy.

Writes one version of `--mib` MiB into shared memory (version_writer.write_version, as the publisher does),
then times, on the same files and target filesystem:
  plain    shutil.copytree of the version directory (no fsync: the page cache holds it)
  plain+fs shutil.copytree then fsync of every file (what durability costs any copier)
  save     DurableStore.save (sendfile copies, then fsync of every file and the directory, temp
           dir + rename)
  verify   DurableStore.read (maps the copy and recomputes every tensor checksum, as a resume does)
and prints MiB/s and the ratios save/plain+fs and verify/save. The copy runs in a background thread
during training (sidecars/tandem/sidecars/trainer/loop/recovery/persist.py), so its cost shows as
`persist_wait_s` only when the next copy is due before this one ends. Not a test.

Run: /root/.cache/tandem/venv/bin/python bench/durable_copy.py [--mib 512] [--target /var/tmp]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / r) for r in ("operator", "sidecars", "spec", "checkpoint_engine")]

import torch  # noqa: E402

from tandem.checkpoint_engine.versions import version_writer  # noqa: E402
from tandem.checkpoint_engine.versions.durable import DurableStore  # noqa: E402


def timed(fn: object) -> float:
    t = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - t


def fsync_tree(path: Path) -> None:
    for f in path.iterdir():
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--target", type=Path, default=Path(tempfile.gettempdir()))
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    shm = Path("/dev/shm") / f"tandem-bench-durable-{uuid.uuid4().hex[:8]}"
    target = args.target / f"tandem-bench-durable-{uuid.uuid4().hex[:8]}"
    try:
        n = args.mib * (1 << 20) // 4 // 8
        tensors = [(f"layer{i}.weight", torch.randn(n)) for i in range(8)]
        src = version_writer.write_version(shm, "job", 1, tensors, shard_bytes=128 << 20).path
        mib = sum(f.stat().st_size for f in src.iterdir()) / (1 << 20)
        print(f"version of {mib:.0f} MiB in {len(list(src.glob('shard-*')))} shards; target {args.target}")
        rows: dict[str, list[float]] = {"plain": [], "plain+fs": [], "save": [], "verify": []}
        for r in range(args.repeat):
            plain = target / f"plain-{r}"
            rows["plain"].append(timed(lambda p=plain: shutil.copytree(src, p)))
            synced = target / f"synced-{r}"
            rows["plain+fs"].append(timed(lambda p=synced: (shutil.copytree(src, p), fsync_tree(p))))
            store = DurableStore(target / f"store-{r}", "ns", "job", "uid")
            rows["save"].append(timed(lambda s=store: s.save(src, 1, iteration=1)))
            rows["verify"].append(timed(lambda s=store: s.read(1)))
            for p in (plain, synced):
                shutil.rmtree(p)
        best = {k: min(v) for k, v in rows.items()}
        for k, s in best.items():
            print(f"{k:9s} {s:7.3f} s  {mib / s:8.0f} MiB/s  (runs: {', '.join(f'{x:.3f}' for x in rows[k])})")
        print(f"ratio save / plain+fsync: {best['save'] / best['plain+fs']:.2f}x   "
              f"save / plain (page cache): {best['save'] / best['plain']:.2f}x   "
              f"verify / save: {best['verify'] / best['save']:.2f}x")
    finally:
        shutil.rmtree(shm, ignore_errors=True)
        shutil.rmtree(target, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
