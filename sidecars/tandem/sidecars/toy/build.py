"""Build the demo's tiny task and model into a directory, idempotently and cached.

Role: `build_toy(out_dir, seed=..., warmup_steps=...)` writes
    out_dir/model/      HF Qwen2, Gemma or Mixtral (config.json, model.safetensors, generation_config.json,
                        tokenizer.json, tokenizer_config.json) — the job's `model.path`
    out_dir/train.jsonl prompts for RL ({prompt, answer}) — the job's `dataset.path`
    out_dir/test.jsonl  held-out prompts for evaluation
    out_dir/toy.json    manifest: parameters, files, warm-up timing and accuracies
and returns their paths. The warm-up (see `toy.model.warm_up`) runs at most `warmup_steps` steps
and stops at the first check (every `check_every` steps from `check_from`) where greedy accuracy
on the first `eval_size` test prompts reaches `target_accuracy`: the model then answers some
problems but far from all, so RL has signal and room (sampled accuracy is lower than greedy).
A directory already holding a complete build with the same parameters
(and builder version) is reused as is; anything else is rebuilt into a temporary directory and
swapped in, so an interrupted build never looks complete. Callers: `python -m tandem.sidecars.toy`,
`tandem run` (examples), tests/toy, benchmarks.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from tandem.sidecars.toy.model import ModelShape, accuracy, random_model, warm_up
from tandem.sidecars.toy.task import corpus, make_problems, read_jsonl, write_jsonl
from tandem.sidecars.toy.tokenizer import save_hf_tokenizer, train_tokenizer

BUILDER_VERSION = 4
MANIFEST = "toy.json"
MODEL_FILES = ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
               "tokenizer_config.json")


@dataclass(frozen=True)
class ToyParams:
    seed: int = 0
    warmup_steps: int = 300  # the most warm-up steps; it stops earlier at target_accuracy
    target_accuracy: float = 0.25  # greedy accuracy on the eval prompts that ends the warm-up
    vocab_size: int = 384
    max_operand: int = 20
    train_size: int = 2048
    test_size: int = 256
    eval_size: int = 128
    check_every: int = 25
    check_from: int = 50
    tied: bool = False  # tied input and output embeddings
    family: str = "qwen2"  # the model's architecture: qwen2, gemma (tied; trains on the hf engine only), or
    # mixtral (4 experts, top-2: the toy mixture-of-experts that routing replay runs on)


@dataclass(frozen=True)
class ToyPaths:
    root: Path
    model_dir: Path
    train_path: Path
    test_path: Path
    manifest_path: Path
    metrics: dict[str, float]


def _paths(root: Path, metrics: dict[str, float]) -> ToyPaths:
    return ToyPaths(root, root / "model", root / "train.jsonl", root / "test.jsonl", root / MANIFEST, metrics)


def _complete(root: Path, wanted: dict[str, Any]) -> dict[str, float] | None:
    """The stored metrics when `root` holds a complete build of `wanted`, else None."""
    try:
        manifest = json.loads((root / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if manifest.get("params") != wanted or manifest.get("builder") != BUILDER_VERSION:
        return None
    files = [root / "train.jsonl", root / "test.jsonl", *[root / "model" / f for f in MODEL_FILES]]
    if not all(f.is_file() and f.stat().st_size > 0 for f in files):
        return None
    return {k: float(v) for k, v in manifest.get("metrics", {}).items()}


def build_toy(out_dir: str | Path, *, seed: int = 0, warmup_steps: int = 300, threads: int | None = 1,
              **params: Any) -> ToyPaths:
    """Build (or reuse) the toy task and model in `out_dir`; see the module docstring.

    Extra `params` override `ToyParams` fields (vocab_size, max_operand, train_size, ...).
    `threads` caps torch's intra-op threads during the warm-up (None: leave as is).
    """
    p = ToyParams(seed=seed, warmup_steps=warmup_steps, **params)
    root = Path(out_dir).resolve()
    wanted = asdict(p)
    if not p.tied:  # builds made before the option existed stay valid
        del wanted["tied"]
    if p.family == "qwen2":
        del wanted["family"]
    cached = _complete(root, wanted)
    if cached is not None:
        return _paths(root, cached)
    root.parent.mkdir(parents=True, exist_ok=True)
    # one builder at a time (tests side by side, two runs): the second finds the first's build complete
    lock_path = Path(tempfile.gettempdir()) / f"tandem-toy-{hashlib.sha1(str(root).encode()).hexdigest()[:16]}.lock"
    with open(lock_path, "w") as lock:  # outside out_dir's folder, which holds builds only
        fcntl.flock(lock, fcntl.LOCK_EX)
        cached = _complete(root, wanted)
        if cached is not None:
            return _paths(root, cached)
        staging = Path(tempfile.mkdtemp(prefix=f".{root.name}.building-", dir=root.parent))
        try:
            metrics = _build_into(staging, p, threads)
            (staging / MANIFEST).write_text(json.dumps(
                {"builder": BUILDER_VERSION, "params": wanted, "metrics": metrics}, indent=2))
            if root.exists():
                old = root.with_name(f".{root.name}.old-{os.getpid()}")
                root.rename(old)
                shutil.rmtree(old, ignore_errors=True)
            staging.rename(root)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return _paths(root, metrics)


def _build_into(out: Path, p: ToyParams, threads: int | None) -> dict[str, float]:
    prev_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        t0 = time.monotonic()
        model_dir = out / "model"
        model_dir.mkdir(parents=True)
        tokenizer = save_hf_tokenizer(train_tokenizer(corpus(p.seed), p.vocab_size), model_dir,
                                      ModelShape().max_position_embeddings)
        train = make_problems(p.seed, p.train_size, max_operand=p.max_operand)
        test = make_problems(p.seed + 1, p.test_size, max_operand=p.max_operand)
        write_jsonl(train, out / "train.jsonl")
        write_jsonl(test, out / "test.jsonl")
        model = random_model(tokenizer, p.seed, ModelShape(tied=p.tied, family=p.family))
        model.eval()
        evaluation = test[:p.eval_size]
        before = accuracy(model, tokenizer, evaluation)
        checks: list[tuple[int, float]] = []

        def reached(step: int, loss: float) -> bool:
            if step < p.check_from or step % p.check_every:
                return False
            model.eval()
            checks.append((step, accuracy(model, tokenizer, evaluation)))
            model.train()
            return checks[-1][1] >= p.target_accuracy

        report = warm_up(model, tokenizer, steps=p.warmup_steps, seed=p.seed, max_operand=p.max_operand,
                         callback=reached if p.target_accuracy > 0 else None)
        last = checks[-1] if checks else None
        after = last[1] if last and last[0] == report.steps else accuracy(model, tokenizer, evaluation)
        sampled = accuracy(model, tokenizer, evaluation, do_sample=True)
        model.save_pretrained(str(model_dir), safe_serialization=True)
        metrics = {"accuracy_before": before, "accuracy_after": after, "sampled_accuracy_after": sampled,
                   "warmup_steps_run": float(report.steps), "warmup_seconds": report.seconds,
                   "parameters": float(sum(t.numel() for t in model.parameters())),
                   "build_seconds": time.monotonic() - t0}
        if report.steps:
            metrics["warmup_final_loss"] = report.final_loss
        return metrics
    finally:
        torch.set_num_threads(prev_threads)


def load_problems(paths: ToyPaths, split: str = "train") -> list[dict[str, Any]]:
    return read_jsonl(paths.train_path if split == "train" else paths.test_path)
