"""Weight-sync benchmark: trainer weights → /dev/shm → etcd → live vLLM, vs memcpy and the naive path.

For a ~100M- and a ~1B-parameter random Qwen2 (fp32), in ONE run on the same machine:
  - single-thread memcpy bandwidth (torch copy_ between pre-faulted buffers, best of 3);
  - vLLM dummy start, then VERSIONS=4 versions as training makes them (each a small step from the
    last), each published (shm write + etcd register + GC) and loaded (resolve + validate incl.
    every checksum + in-place reload). v1 and v2 are written into fresh /dev/shm pages; from v3 on
    (keep=1) each publish writes into the slot files of the version released before it
    (publisher.py, slots.py). "first" is v1, "steady" the mean of v3 and v4;
  - the naive path: save_pretrained to disk + terminate vLLM + start vLLM on that directory.
Ratios printed: shm→vLLM leg bandwidth / memcpy (target ≥ 0.5) and naive / steady update (target ≥ 20).
`--publish-only`: the publisher alone (no vLLM, no model in memory), first/second/steady publishes.
Not a test. Run (etcd on PATH; the full 1B run needs ~18 GiB of RAM, --publish-only ~8 GiB of shm):
    nice -n 10 /root/.cache/tandem/venv/bin/python bench/weight_sync.py [--sizes 100m,1b] [--publish-only]

Measured 2026-11-23 on this 2-core machine (shared with other jobs; single-thread memcpy 19 GB/s):
  full, --sizes 100m (0.40 GB/version): first publish 0.17 s (2.4 GB/s, fresh pages), v2 0.42 s
    (fresh), steady publish 0.08 s (5.7 GB/s, 100% recycled); steady update (validate 0.07 +
    reload 0.38) 0.45 s; steady whole sync 0.54 s vs naive save+restart 20.3 s = 37.8x (first sync
    0.67 s: 30.4x).
  --publish-only --sizes 100m,1b: 100m first 0.17 s / v2 0.16 s / steady 0.08 s (5.2 GB/s);
    1b (3.77 GB/version) first 1.54 s (2.45 GB/s) / v2 1.55 s / steady 0.76 s (5.0 GB/s, 100% recycled).
    A plain write() into already-allocated tmpfs pages runs at 6.7-6.9 GB/s here (mmap + copy_:
    4-5 GB/s), so the steady publish is at the machine's tmpfs write speed less the checksums.
  full --sizes 1b: not measured this time: trainer model + vLLM + two versions of shm reach ~17 GiB,
    and with other jobs on the machine the run was stopped by a memory guard (1.2 GiB left).
Measured 2026-11-25, full --sizes 1b, two runs on a quiet 2-core machine (single-thread memcpy only
7.2-9.0 GB/s on this host): first publish 6.63 / 6.77 s (0.56 GB/s, fresh pages), v2 6.54 / 6.20 s,
steady publish 0.92 / 0.98 s (4.1 / 3.9 GB/s, 100% recycled): recycling makes the 1B publish 7x
faster. Steady update 6.09 / 6.47 s (validate 0.63 / 0.68, vLLM reload 5.45 / 5.79), steady sync
7.0 / 7.5 s vs naive save+restart 38.0 / 43.7 s = 5.4x / 5.9x (target 20x: not met at 1B on CPU;
first sync 2.6x / 2.9x). Where the reload goes (py-spy on the vLLM worker during the updates): 58%
in vLLM-CPU's oneDNN GEMM weight packing (`dispatch_cpu_unquantized_gemm` -> `create_onednn_mm`,
redone by `process_weights_after_loading` for every linear layer and the output head), ~30%
copying through vLLM's weight loaders; on GPU vLLM the unquantized linear layers repack nothing.
"""

from __future__ import annotations

import argparse
import gc
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "checkpoint_engine")]

SIZES: dict[str, dict[str, int]] = {  # Qwen2 shapes; head_dim 64 (CPU attention kernels need %32)
    "100m": dict(
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=8,
        num_attention_heads=12,
        num_key_value_heads=4,
        vocab_size=32000,
    ),
    "1b": dict(
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=18,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=32000,
    ),
}


def memcpy_gbps(nbytes: int = 1 << 30) -> float:
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    src = torch.ones(nbytes, dtype=torch.uint8)
    dst = torch.zeros(nbytes, dtype=torch.uint8)
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t)
    torch.set_num_threads(threads)
    del src, dst
    return nbytes / best / 1e9


def build_model(size: str, out: Path) -> Any:
    """A random Qwen2 of the given size, saved as config + tokenizer (weights come later)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(**SIZES[size], max_position_embeddings=2048, tie_word_embeddings=False, torch_dtype="float32")
    with torch.device("meta"):
        model = Qwen2ForCausalLM(cfg)
    model = model.to_empty(device="cpu")
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02, generator=g)
    model.eval()
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(
        [f"sample text number {i} for the benchmark tokenizer" for i in range(200)],
        trainers.BpeTrainer(vocab_size=500, special_tokens=["<unk>", "<|endoftext|>"]),
    )
    out.mkdir(parents=True, exist_ok=True)
    cfg.save_pretrained(out)
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", unk_token="<unk>").save_pretrained(out)
    return model


def raw_leg(path: Path, model: Any) -> float:
    import torch

    from tandem.checkpoint_engine.versions import layout

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    params = dict(model.state_dict())
    t = time.perf_counter()
    mapped = layout.MappedVersion(path)
    mapped.verify_checksums()
    with torch.no_grad():
        for name, view in mapped.tensors():
            params[name].copy_(view)
    dt = time.perf_counter() - t
    torch.set_num_threads(threads)
    return dt


def start_etcd(tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    def port() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])

    cp, pp = port(), port()
    proc = subprocess.Popen(
        [
            "etcd",
            "--data-dir",
            str(tmp / "etcd"),
            "--listen-client-urls",
            f"http://127.0.0.1:{cp}",
            "--advertise-client-urls",
            f"http://127.0.0.1:{cp}",
            "--listen-peer-urls",
            f"http://127.0.0.1:{pp}",
            "--initial-advertise-peer-urls",
            f"http://127.0.0.1:{pp}",
            "--initial-cluster",
            f"default=http://127.0.0.1:{pp}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(200):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", cp)) == 0:
                return proc, f"http://127.0.0.1:{cp}"
        time.sleep(0.05)
    raise RuntimeError("etcd did not start")


VERSIONS = 4


def _mean(xs: Any) -> float:
    vals = [float(x) for x in xs]
    return sum(vals) / len(vals)


def run_size(size: str, endpoint: str, tmp: Path, memcpy: float) -> dict[str, Any]:
    import torch

    from tandem.checkpoint_engine.etcd.sync_registry import SyncRegistry
    from tandem.checkpoint_engine.service.publisher import Publisher
    from tandem.sidecars.rollout_engine.engine import EngineConfig, RolloutEngine

    model_dir = tmp / f"model-{size}"
    model = build_model(size, model_dir)
    params = sum(p.numel() for p in model.parameters())
    shm = Path("/dev/shm") / f"tandem-bench-{size}-{time.time_ns()}"
    pub = Publisher(shm, size, SyncRegistry(endpoint, "bench", size, "pod0", "trainer").connect(), keep=1)
    eng = RolloutEngine(
        EngineConfig(shm_root=shm, job=size, max_model_len=512, dtype="float32"),  # the published dtype, GPU too
        SyncRegistry(endpoint, "bench", size, "pod0", "rollout").connect(),
    )
    r: dict[str, Any] = {"size": size, "params_m": params / 1e6}
    try:
        t = time.perf_counter()
        eng.start(str(model_dir), dummy=True)
        r["dummy_start_s"] = time.perf_counter() - t
        # VERSIONS versions, as training makes them: each a small step away from the last. v1 and v2
        # are written into fresh /dev/shm pages; from v3 on (keep=1: v1 released after v2) each
        # publish writes into the slot files of the version released before it
        steps = []
        for v in range(1, VERSIONS + 1):
            if v > 1:
                with torch.no_grad():
                    for p in model.parameters():
                        p.add_(1e-4)
            t = time.perf_counter()
            rep = pub.publish(v, model.state_dict().items())
            upd = eng.update(v)  # resolve + validate every checksum + in-place reload
            steps.append((rep, upd, time.perf_counter() - t))
        first, steady = steps[0], steps[2:]
        nbytes = first[0].bytes
        r.update(
            bytes=nbytes,
            first_publish_s=first[0].total_s,
            first_write_gbps=nbytes / first[0].write_s / 1e9,
            first_update_s=first[1].total_s,
            first_sync_s=first[2],
            second_publish_s=steps[1][0].total_s,
            publish_s=_mean(s[0].total_s for s in steady),
            write_s=_mean(s[0].write_s for s in steady),
            write_gbps=nbytes / _mean(s[0].write_s for s in steady) / 1e9,
            register_s=_mean(s[0].register_s for s in steady),
            recycled=min(s[0].recycled_bytes for s in steady) / nbytes,
            update_s=_mean(s[1].total_s for s in steady),
            validate_s=_mean(s[1].validate_s for s in steady),
            load_s=_mean(s[1].load_s for s in steady),
            sync_s=_mean(s[2] for s in steady),  # publish (shm write + register + GC) + update
            worker_load_s=max(w["load_s"] for w in steady[-1][1].workers),
        )
        r["sync_gbps"] = nbytes / r["sync_s"] / 1e9
        r["leg_gbps"] = nbytes / (r["validate_s"] + r["load_s"]) / 1e9
        r["leg_vs_memcpy"] = r["leg_gbps"] / memcpy
        # the same leg without vLLM's own post-processing: map + verify every checksum + copy into
        # the trainer model's (already allocated) parameters, one thread, in this process
        r["raw_leg_s"] = raw_leg(Path(steady[-1][0].path), model)
        r["raw_leg_gbps"] = nbytes / r["raw_leg_s"] / 1e9
        r["raw_leg_vs_memcpy"] = r["raw_leg_gbps"] / memcpy
        shutil.rmtree(shm, ignore_errors=True)  # frees two versions of RAM before the naive restart
        ref = eng.generate([[1, 2, 3]], None)[0][0].token_ids  # noqa: F841 - engine alive after update
        # naive path: save_pretrained + terminate + start on the saved dir
        disk = tmp / f"naive-{size}"
        t = time.perf_counter()
        model.save_pretrained(disk)
        shutil.copy(model_dir / "tokenizer.json", disk)
        shutil.copy(model_dir / "tokenizer_config.json", disk)
        r["naive_save_s"] = time.perf_counter() - t
        t2 = time.perf_counter()
        r["terminate_s"] = eng.terminate()["terminate_s"]
        eng.start(str(disk), dummy=False)
        r["naive_restart_s"] = time.perf_counter() - t2
        r["naive_s"] = time.perf_counter() - t
        r["naive_vs_ours"] = r["naive_s"] / r["sync_s"]
        r["naive_vs_first"] = r["naive_s"] / r["first_sync_s"]
        shutil.rmtree(disk, ignore_errors=True)
    finally:
        eng.terminate()
        pub.close()
        eng.registry.close()  # type: ignore[union-attr]
        shutil.rmtree(shm, ignore_errors=True)
        del model
        gc.collect()
    return r


def publish_only(size: str, endpoint: str) -> dict[str, Any]:
    """Publisher alone (no vLLM, no model in memory: each tensor is a view of one random pool, at
    an offset per version): first, second and steady-state publishes. Needs two versions of /dev/shm."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from tandem.checkpoint_engine.etcd.sync_registry import SyncRegistry
    from tandem.checkpoint_engine.service.publisher import Publisher

    with torch.device("meta"):
        meta = Qwen2ForCausalLM(Qwen2Config(**SIZES[size], tie_word_embeddings=False))
    shapes = [(n, tuple(t.shape)) for n, t in meta.state_dict().items()]
    biggest = max(t.numel() for t in meta.state_dict().values())
    pool = torch.randn(biggest + VERSIONS * 64, generator=torch.Generator().manual_seed(0))

    def tensors(v: int) -> Any:
        for name, shape in shapes:
            n = 1
            for d in shape:
                n *= d
            yield name, pool[v * 64 : v * 64 + n].view(shape)

    shm = Path("/dev/shm") / f"tandem-bench-pub-{size}-{time.time_ns()}"
    pub = Publisher(shm, size, SyncRegistry(endpoint, "bench", f"pub-{size}", "pod0", "trainer").connect(), keep=1)
    try:
        reps = [pub.publish(v, tensors(v)) for v in range(1, VERSIONS + 1)]
    finally:
        pub.close()
        shutil.rmtree(shm, ignore_errors=True)
    nbytes, steady = reps[0].bytes, reps[2:]
    return {
        "size": size,
        "params_m": sum(t.numel() for t in meta.state_dict().values()) / 1e6,
        "bytes": nbytes,
        "first_publish_s": reps[0].total_s,
        "first_write_gbps": nbytes / reps[0].write_s / 1e9,
        "second_publish_s": reps[1].total_s,
        "publish_s": _mean(r.total_s for r in steady),
        "write_gbps": nbytes / _mean(r.write_s for r in steady) / 1e9,
        "recycled": min(r.recycled_bytes for r in steady) / nbytes,
        "register_s": _mean(r.register_s for r in steady),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="100m,1b")
    ap.add_argument("--publish-only", action="store_true", help="the publisher alone (no vLLM, no naive path)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="tandem-bench-"))
    etcd, endpoint = start_etcd(tmp)
    rows = []
    try:
        memcpy = memcpy_gbps()
        print(f"single-thread memcpy: {memcpy:.2f} GB/s", flush=True)
        from tandem.checkpoint_engine.versions import hashing

        sums = ", ".join(f"{k} {v:.2f} GB/s" for k, v in hashing.throughput().items())
        print(f"checksums: {sums} (layout uses {hashing.ALGORITHM})", flush=True)
        for size in args.sizes.split(","):
            rows.append(publish_only(size, endpoint) if args.publish_only else run_size(size, endpoint, tmp, memcpy))
            print(rows[-1], flush=True)
    finally:
        etcd.terminate()
        etcd.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    cols = [
        ("params (M)", "params_m", "{:.0f}"),
        ("GB per version", "bytes", "{:.2f}"),
        ("first publish s (fresh pages)", "first_publish_s", "{:.2f}"),
        ("first shm write GB/s", "first_write_gbps", "{:.2f}"),
        ("first update s", "first_update_s", "{:.2f}"),
        ("first sync s (publish + update)", "first_sync_s", "{:.2f}"),
        ("v2 publish s (fresh pages)", "second_publish_s", "{:.2f}"),
        ("steady publish s (recycled)", "publish_s", "{:.2f}"),
        ("steady shm write GB/s", "write_gbps", "{:.2f}"),
        ("steady recycled fraction", "recycled", "{:.2f}"),
        ("steady register s", "register_s", "{:.3f}"),
        ("steady update s", "update_s", "{:.2f}"),
        ("  validate s", "validate_s", "{:.2f}"),
        ("  load s", "load_s", "{:.2f}"),
        ("steady sync s (publish + update)", "sync_s", "{:.2f}"),
        ("steady sync GB/s", "sync_gbps", "{:.2f}"),
        ("leg GB/s", "leg_gbps", "{:.2f}"),
        ("leg/memcpy", "leg_vs_memcpy", "{:.2f}"),
        ("raw leg GB/s", "raw_leg_gbps", "{:.2f}"),
        ("raw leg/memcpy", "raw_leg_vs_memcpy", "{:.2f}"),
        ("naive s (save + restart)", "naive_s", "{:.1f}"),
        ("naive/steady sync", "naive_vs_ours", "{:.1f}"),
        ("naive/first sync", "naive_vs_first", "{:.1f}"),
        ("dummy start s", "dummy_start_s", "{:.1f}"),
        ("terminate s", "terminate_s", "{:.1f}"),
    ]
    print(f"\nsingle-thread memcpy {memcpy:.2f} GB/s; targets: leg/memcpy >= 0.5, naive/steady sync >= 20")
    print(" | ".join(["metric"] + [r["size"] for r in rows]))
    for title, key, fmt in cols:
        if key not in rows[0]:
            continue
        vals = [fmt.format(r[key] / 1e9 if key == "bytes" else r[key]) for r in rows]
        print(" | ".join([title, *vals]))


if __name__ == "__main__":
    main()
