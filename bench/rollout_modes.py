"""Rollout-mode benchmark: synchronous vs partial rollouts vs asynchronous (maxStaleness 1, 2), one run.

The task has a long-tailed answer length, as real RL data does: the toy model (`tandem.sidecars.toy`,
single-digit sums, answers of ~6 tokens) is fine-tuned here, besides its sums, to answer every tenth
prompt (`Count from N:`) by counting without end, so those answers run to `rollout.maxTokens` (320)
and earn no reward (an unfinished answer is wrong). Each mode runs `tandem run` on one hybrid pod
plus one rollout-only pod, the same model, prompts, rewards, group size, learning rate and number
of iterations; GRPO with tisCap 2 in every mode (the synchronous loop's weights are ~1: same loss).
Reported per mode (mean and range over --repeats runs, interleaved so that load drifts hit every
mode): trained completions, completions/s in the loop (sum of per-iteration seconds, evaluations left
out), mean reward over the last quarter, held-out pass@1 on 64 of the toy's test sums (spec.eval at
the start, every quarter and the end, the same prompts in every mode), staleness, carried share and
wasted tokens, and the ratio of completions/s to sync's; DIR/rollout_modes.png plots every run's
reward against trained completions, its held-out pass@1, and the throughput.

Measured 2026-11-25 (2 cores, AVX2), --pin-pods (hybrid pod on core 0, rollout-only pod on core 1,
as on separate nodes), 16 iterations of 16 prompts x 8, two runs per mode interleaved (mean, range):
    mode       compl/s             ratio  reward(last 1/4)     held-out pass@1 0 -> end
    sync       29.0 (27.6-30.4)    1.00   0.554 (0.419-0.689)  0.746 -> 0.438 (0.305-0.570)
    partial    44.4 (38.5-50.3)    1.53   0.656 (0.609-0.703)  0.719 -> 0.518 (0.473-0.562)
    async k=1  53.2 (51.6-54.8)    1.83   0.590 (0.576-0.605)  0.721 -> 0.514 (0.422-0.605)
Target (partial or async >= 1.5x sync at a reward no worse within noise): met by both. Sync waits for
the slowest answer of every batch (rollout 2.68 s/iteration); partial rollouts cut them at 48 tokens
(1.50 s); asynchronous k=1 generates on the rollout-only pod while the trainer trains (the hybrid pod's
vLLM too: it shares core 0 with the trainer, train 2.23 s vs 1.52). Held-out accuracy on the sums falls
in every mode alike (the bench's lr 2e-4 trades them for the count prompts' length), so it shows
parity between modes, not learning. A first pair of runs the same day, before shared-prompt rows were
capped at hidden/2 tokens (1024-token rows doubled this toy's train step), gave sync 19.4, partial 29.1
(1.50x), async k=1 28.2 (1.46x). Unpinned (every process on both cores, 2026-11-24): sync 37.3, partial
38.2, async k=1 48.1, k=2 47.7 completions/s — there the modes compete for the same two cores.

Not a test. Run (about 3 minutes per mode and run on 2 cores):
    /root/.cache/tandem/venv/bin/python bench/rollout_modes.py [--pin-pods] [--repeats N] [--modes ...] [--out DIR]
It prints a table and writes DIR/rollout_modes.json (default DIR: /tmp/tandem-bench/rollout_modes).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path
from statistics import mean
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ROOTS = ("operator", "sidecars", "spec", "checkpoint_engine")
JOB = "bench-rollout-modes"
LONG_SHARE = 10  # every 10th training prompt asks for an endless count
MAX_TOKENS = 320
POSITIONS = 512  # the bench's copy of the toy model is taught positions beyond the toy's 128
EVAL_PROMPTS = 64  # held-out sums scored by spec.eval (a sum's answer is ~6 tokens: 16 suffice)
MODES: dict[str, dict[str, Any]] = {
    "sync": {},
    "partial": {"rollout": {"partial": {"tokenBudget": 48, "maxAge": 8}}},
    "async k=1": {"algorithm": {"maxStaleness": 1}},
    "async k=2": {"algorithm": {"maxStaleness": 2}},
}


def long_prompt(n: int) -> str:
    return f"Count from {n}:"


def count_from(n: int, tokens: int, tokenizer: Any) -> list[int]:
    """` n n+1 n+2 ...` as token ids, `tokens` long (no end: the answer never stops)."""
    text = "".join(f" {i}" for i in range(n, n + tokens))
    return list(tokenizer(text, add_special_tokens=False)["input_ids"][:tokens])


def build_task(out: Path, steps: int = 300) -> tuple[Path, Path]:
    """(model dir, train.jsonl): the toy model taught to count without end after `Count from N:`, and
    its sums with every LONG_SHARE-th prompt replaced by a count. Cached in `out`. The held-out sums
    (spec.eval) are the toy's test.jsonl beside them (`out / "toy" / "test.jsonl"`)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tandem.sidecars.toy.build import build_toy
    from tandem.sidecars.toy.dataset import make_problems, read_jsonl, target_completion, write_jsonl

    model_dir, train = out / f"model-long-tail-{MAX_TOKENS}", out / "train-long-tail.jsonl"
    if (model_dir / "model.safetensors").is_file() and train.is_file():
        return model_dir, train
    toy = build_toy(out / "toy", seed=0, warmup_steps=150, max_operand=10)
    rows = read_jsonl(toy.train_path)
    rows = [{"prompt": long_prompt(i % 50), "answer": "never"} if i % LONG_SHARE == LONG_SHARE - 1 else r
            for i, r in enumerate(rows)]
    tok = AutoTokenizer.from_pretrained(toy.model_dir)
    model = AutoModelForCausalLM.from_pretrained(toy.model_dir)
    model.config.max_position_embeddings = POSITIONS  # rotary positions: only the config limits them
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    rng = random.Random(0)
    model.train()
    t0 = time.perf_counter()
    for step in range(steps):  # sums (to keep them) and counts, completion tokens only
        seqs: list[tuple[list[int], list[int]]] = []
        for r in make_problems(5000 + step, 24, max_operand=10):
            c = tok(target_completion(r["answer"]), add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            seqs.append((tok(r["prompt"])["input_ids"], c))
        for _ in range(8):
            n = rng.randrange(50)
            p = tok(long_prompt(n))["input_ids"]
            seqs.append((p, count_from(n, MAX_TOKENS + 24, tok)))
        width = max(len(p) + len(c) for p, c in seqs)
        ids = torch.full((len(seqs), width), tok.pad_token_id, dtype=torch.int64)
        labels = torch.full((len(seqs), width), -100, dtype=torch.int64)
        mask = torch.zeros(len(seqs), width, dtype=torch.int64)
        for i, (p, c) in enumerate(seqs):
            ids[i, :len(p) + len(c)] = torch.tensor(p + c)
            labels[i, len(p):len(p) + len(c)] = torch.tensor(c)
            mask[i, :len(p) + len(c)] = 1
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 0:
            print(f"  fine-tune step {step}: loss {float(loss):.3f} ({time.perf_counter() - t0:.0f}s)", flush=True)
    shutil.rmtree(model_dir, ignore_errors=True)
    shutil.copytree(toy.model_dir, model_dir)
    model.save_pretrained(model_dir, safe_serialization=True)
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    config["model_max_length"] = POSITIONS
    (model_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    write_jsonl(rows, train)
    return model_dir, train


def job_yaml(mode: str, model: Path, train: Path, iterations: int, path: Path) -> Path:
    """The mode's job; spec.eval scores held-out sums (greedy pass@1 and 4 samples at temperature 1)
    at the start, every quarter of the run and the end, the same prompts in every mode."""
    import yaml

    from tandem.sidecars.toy.dataset import reward_specs

    algorithm: dict[str, Any] = {"name": "grpo", "groupSize": 8, "klCoef": 0.0, "clip": 0.2, "lr": 2e-4,
                                 "iterations": iterations, "tisCap": 2.0}
    rollout: dict[str, Any] = {"tensorParallel": 1, "maxTokens": MAX_TOKENS, "temperature": 1.0,
                               "promptsPerIteration": 16, "betweenRollouts": "keep"}
    algorithm |= MODES[mode].get("algorithm", {})
    rollout |= MODES[mode].get("rollout", {})
    spec = {"apiVersion": "tandem.dev/v1alpha1", "kind": "RLHFJob", "metadata": {"name": JOB},
            "spec": {"model": {"path": str(model)}, "dataset": {"path": str(train)}, "algorithm": algorithm,
                     "eval": {"dataset": {"path": str(train.parent / "toy" / "test.jsonl")},
                              "every": max(1, iterations // 4), "prompts": EVAL_PROMPTS, "samples": 4,
                              "temperature": 1.0, "maxTokens": 16},
                     "replicas": 1, "rolloutOnlyReplicas": 1, "gpusPerPod": 0,
                     "trainer": {"tensorParallel": 1, "pipelineParallel": 1, "globalBatchSize": 128,
                                 "microBatchSize": 32, "offload": False},
                     "rollout": rollout, "rewards": reward_specs(),
                     "checkpointEngine": {"shmSize": "1Gi", "transport": "tcp", "shardSizeMiB": 64},
                     "failurePolicy": {"maxRestarts": 0}}}
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def run_mode(mode: str, job: Path, workdir: Path, pin_pods: bool) -> dict[str, Any]:
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(ROOT / r) for r in ROOTS)}
    with open(workdir / "tandem-run.log", "w") as f:
        argv = [sys.executable, "-m", "tandem.cli.main", "run", str(job), "--workdir", str(workdir)]
        rc = subprocess.run(argv + (["--pin-pods"] if pin_pods else []),
                            cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, check=False).returncode
    path = workdir / JOB / "metrics.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
    evals_path = workdir / JOB / "eval.jsonl"
    evals = [json.loads(x) for x in evals_path.read_text().splitlines() if x.strip()] if evals_path.exists() else []
    if rc != 0 or not rows:
        raise SystemExit(f"{mode}: tandem run failed (rc={rc}); see {workdir / 'tandem-run.log'}")
    done, curve = 0, []
    for r in rows:
        done += r["completions"]
        curve.append((done, r["reward_mean"]))
    last = rows[-max(1, len(rows) // 4):]
    hist: dict[str, int] = {}
    for r in rows:
        for k, v in r.get("staleness_hist", {}).items():
            hist[k] = hist.get(k, 0) + v
    # the loop without its evaluations (the same held-out work in every mode, not rollout throughput)
    seconds = sum(r["total_seconds"] - r["seconds"].get("eval", 0.0) for r in rows)
    return {"completions": done, "loop_seconds": seconds, "completions_per_s": done / seconds,
            "reward_last": sum(r["reward_mean"] for r in last) / len(last), "curve": curve,
            "eval": [(e["iteration"], e["pass_at_1"], e["pass_at_k"]) for e in evals],
            "staleness_hist": hist, "carried_share": sum(r.get("carried_share", 0.0) for r in rows) / len(rows),
            "wasted_tokens": sum(r.get("wasted_tokens", 0) for r in rows),
            "completion_len": sum(r["completion_tokens"] for r in rows) / done,
            "rollout_s": sum(r["seconds"]["rollout"] for r in rows) / len(rows),
            "train_s": sum(r["seconds"]["train"] for r in rows) / len(rows)}


def plot(results: dict[str, list[dict[str, Any]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, e, b) = plt.subplots(1, 3, figsize=(16, 4))
    for n, (mode, runs) in enumerate(results.items()):
        color = f"C{n}"
        for k, r in enumerate(runs):
            xs, ys = zip(*r["curve"], strict=True)
            a.plot(xs, ys, marker=".", color=color, alpha=0.8, label=mode if k == 0 else None)
            if r["eval"]:
                its, p1, _ = zip(*r["eval"], strict=True)
                e.plot(its, p1, marker="o", color=color, alpha=0.8, label=mode if k == 0 else None)
    a.set(xlabel="trained completions", ylabel="training reward mean", title="reward vs trained completions")
    e.set(xlabel="iterations", ylabel="held-out pass@1 (sampled, T=1)", title="held-out sums")
    a.legend()
    e.legend()
    modes = list(results)
    b.bar(modes, [mean([r["completions_per_s"] for r in results[m]]) for m in modes])
    for i, m in enumerate(modes):
        b.scatter([i] * len(results[m]), [r["completions_per_s"] for r in results[m]], color="k", zorder=3)
    b.set(ylabel="completions/s (loop, without eval)", title="throughput (bars: mean, dots: runs)")
    fig.tight_layout()
    fig.savefig(path)


def spread(xs: list[float]) -> str:
    return f"{mean(xs):.3f}" if len(xs) == 1 else f"{mean(xs):.3f} ({min(xs):.3f}-{max(xs):.3f})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iterations", type=int, default=16)
    ap.add_argument("--out", type=Path, default=Path("/tmp/tandem-bench/rollout_modes"))
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of " + ", ".join(MODES))
    ap.add_argument("--repeats", type=int, default=1, help="runs per mode, interleaved (sync, partial, ..., sync, ...)")
    ap.add_argument("--pin-pods", action="store_true",
                    help="each pod on its own cores (tandem run --pin-pods), as on separate nodes")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    print("building the long-tailed task (cached)", flush=True)
    model, train = build_task(args.out)
    modes = args.modes.split(",")
    results: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    for k in range(args.repeats):
        for mode in modes:
            print(f"running {mode} ({k + 1}/{args.repeats})", flush=True)
            slug = mode.replace(" ", "").replace("=", "")
            job = job_yaml(mode, model, train, args.iterations, args.out / f"{slug}.yaml")
            results[mode].append(run_mode(mode, job, args.out / f"{slug}-{k}", args.pin_pods))
    base = mean([r["completions_per_s"] for r in results.get("sync", next(iter(results.values())))])
    print(f"{'mode':<10} {'trained':>8} {'compl/s':>20} {'ratio':>5} {'reward(last 1/4)':>20} {'pass@1 0->end':>22} "
          f"{'len':>5} {'rollout s':>9} {'train s':>7} {'carried':>7} {'wasted':>6}  staleness")
    for mode, runs in results.items():
        cps = [r["completions_per_s"] for r in runs]
        first = [r["eval"][0][1] for r in runs if r["eval"]]
        end = [r["eval"][-1][1] for r in runs if r["eval"]]
        evals = f"{mean(first):.3f} -> {spread(end)}" if end else "-"
        print(f"{mode:<10} {runs[0]['completions']:>8} {spread(cps):>20} {mean(cps) / base:>5.2f} "
              f"{spread([r['reward_last'] for r in runs]):>20} {evals:>22} "
              f"{mean([r['completion_len'] for r in runs]):>5.1f} {mean([r['rollout_s'] for r in runs]):>9.2f} "
              f"{mean([r['train_s'] for r in runs]):>7.2f} {mean([r['carried_share'] for r in runs]):>7.2f} "
              f"{sum(r['wasted_tokens'] for r in runs) // len(runs):>6}  {runs[0]['staleness_hist']}")
    (args.out / "rollout_modes.json").write_text(json.dumps(results, indent=2))
    plot(results, args.out / "rollout_modes.png")
    print(f"wrote {args.out / 'rollout_modes.json'} and {args.out / 'rollout_modes.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
