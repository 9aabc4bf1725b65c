"""Weight-sync benchmark: trainer weights → /dev/shm → etcd → live vLLM, vs memcpy and the naive path.

For a ~100M- and a ~1B-parameter random Qwen2 (fp32), in ONE run on the same machine:
  - single-thread memcpy bandwidth (torch copy_ between pre-faulted buffers, best of 3);
  - vLLM dummy start, first update (publish = shm write + etcd register; update = resolve +
    validate incl. every checksum + in-place reload), a second (steady) update of the same version,
    and vLLM terminate;
  - the naive path: save_pretrained to disk + terminate vLLM + start vLLM on that directory.
Ratios printed: shm→vLLM leg bandwidth / memcpy (target ≥ 0.5) and naive / ours (target ≥ 20).
Not a test. Run (etcd on PATH; takes a few minutes, the 1B model needs ~16 GiB of RAM):
    /root/.cache/tandem/venv/bin/python bench/weight_sync.py [--sizes 100m,1b]
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

    from tandem.checkpoint_engine import layout

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


def run_size(size: str, endpoint: str, tmp: Path, memcpy: float) -> dict[str, Any]:
    from tandem.checkpoint_engine.publisher import Publisher
    from tandem.checkpoint_engine.rollout_engine import EngineConfig, RolloutEngine
    from tandem.checkpoint_engine.sync_registry import SyncRegistry

    model_dir = tmp / f"model-{size}"
    model = build_model(size, model_dir)
    params = sum(p.numel() for p in model.parameters())
    shm = Path("/dev/shm") / f"tandem-bench-{size}-{time.time_ns()}"
    pub = Publisher(shm, size, SyncRegistry(endpoint, "bench", size, "pod0", "trainer").connect(), keep=1)
    eng = RolloutEngine(
        EngineConfig(shm_root=shm, job=size, max_model_len=512),
        SyncRegistry(endpoint, "bench", size, "pod0", "rollout").connect(),
    )
    r: dict[str, Any] = {"size": size, "params_m": params / 1e6}
    try:
        t = time.perf_counter()
        eng.start(str(model_dir), dummy=True)
        r["dummy_start_s"] = time.perf_counter() - t
        t = time.perf_counter()
        rep = pub.publish(1, model.state_dict().items())
        upd = eng.update()
        r["first_sync_s"] = time.perf_counter() - t
        r.update(
            bytes=rep.bytes,
            write_s=rep.write_s,
            register_s=rep.register_s,
            first_validate_s=upd.validate_s,
            first_load_s=upd.load_s,
            worker_load_s=max(w["load_s"] for w in upd.workers),
        )
        upd2 = eng.update(1)  # steady state: the same version again (pages of shm already resident)
        r.update(validate_s=upd2.validate_s, load_s=upd2.load_s, resolve_s=upd2.resolve_s)
        leg = upd2.validate_s + upd2.load_s
        r["leg_gbps"] = rep.bytes / leg / 1e9
        r["sync_s"] = rep.write_s + rep.register_s + upd2.total_s  # export+shm write+register+load
        r["sync_gbps"] = rep.bytes / r["sync_s"] / 1e9
        r["leg_vs_memcpy"] = r["leg_gbps"] / memcpy
        # the same leg without vLLM's own post-processing: map + verify every checksum + copy into
        # the trainer model's (already allocated) parameters, one thread, in this process
        r["raw_leg_s"] = raw_leg(Path(rep.path), model)
        r["raw_leg_gbps"] = rep.bytes / r["raw_leg_s"] / 1e9
        r["raw_leg_vs_memcpy"] = r["raw_leg_gbps"] / memcpy
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
        shutil.rmtree(disk, ignore_errors=True)
    finally:
        eng.terminate()
        pub.close()
        eng.registry.close()  # type: ignore[union-attr]
        shutil.rmtree(shm, ignore_errors=True)
        del model
        gc.collect()
    return r


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="100m,1b")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="tandem-bench-"))
    etcd, endpoint = start_etcd(tmp)
    rows = []
    try:
        memcpy = memcpy_gbps()
        print(f"single-thread memcpy: {memcpy:.2f} GB/s", flush=True)
        from tandem.checkpoint_engine import hashing

        sums = ", ".join(f"{k} {v:.2f} GB/s" for k, v in hashing.throughput().items())
        print(f"checksums: {sums} (layout uses {hashing.ALGORITHM})", flush=True)
        for size in args.sizes.split(","):
            rows.append(run_size(size, endpoint, tmp, memcpy))
            print(rows[-1], flush=True)
    finally:
        etcd.terminate()
        etcd.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    cols = [
        ("params (M)", "params_m", "{:.0f}"),
        ("GB", "bytes", "{:.2f}"),
        ("shm write s", "write_s", "{:.2f}"),
        ("register s", "register_s", "{:.3f}"),
        ("validate s", "validate_s", "{:.2f}"),
        ("load s", "load_s", "{:.2f}"),
        ("sync s", "sync_s", "{:.2f}"),
        ("sync GB/s", "sync_gbps", "{:.2f}"),
        ("leg GB/s", "leg_gbps", "{:.2f}"),
        ("leg/memcpy", "leg_vs_memcpy", "{:.2f}"),
        ("raw leg GB/s", "raw_leg_gbps", "{:.2f}"),
        ("raw leg/memcpy", "raw_leg_vs_memcpy", "{:.2f}"),
        ("naive s", "naive_s", "{:.1f}"),
        ("naive/ours", "naive_vs_ours", "{:.1f}"),
        ("dummy start s", "dummy_start_s", "{:.1f}"),
        ("first sync s", "first_sync_s", "{:.2f}"),
        ("terminate s", "terminate_s", "{:.1f}"),
    ]
    print(f"\nsingle-thread memcpy {memcpy:.2f} GB/s; targets: leg/memcpy >= 0.5, naive/ours >= 20")
    print(" | ".join(["metric"] + [r["size"] for r in rows]))
    for title, key, fmt in cols:
        vals = [fmt.format(r[key] / 1e9 if key == "bytes" else r[key]) for r in rows]
        print(" | ".join([title, *vals]))


if __name__ == "__main__":
    main()
