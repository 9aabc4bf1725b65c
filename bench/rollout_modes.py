"""Rollout-mode benchmark: synchronous vs partial rollouts vs asynchronous (maxStaleness 1, 2), side by side.

The task is examples/smollm2-grpo.yaml's, on which the synchronous loop learns (held-out pass@1 ~0.1 ->
0.26 in 5 iterations there), with a long tail of answer length, as real RL data has: SmolLM2-135M-Instruct
(`tandem models fetch smollm2-135m`) answers chat-format single-digit sums (answerMatch flexible), and
every LONG_SHARE-th training prompt asks for a numbered list of 61 numbers, whose answers run to
rollout.maxTokens (MAX_TOKENS) and earn 0. Each mode runs `tandem run` on one hybrid pod plus one
rollout-only pod (--pin-pods: each pod on its own core, as on separate nodes) with the same model,
prompts, rewards, group size (4), learning rate (1e-5), tisCap 2 and number of iterations, so the same
number of trained completions. Held-out: the 24 sums of examples/arith/test.jsonl, each in 4 phrasings
(96 prompts), `--eval-samples` samples at T=1 of up to `--eval-max-tokens` (default the rollouts' 128), at the
start, the middle and the end (`--eval-every`), the same prompts in every mode. Runs are interleaved (sync,
partial, async, sync, ...) so that load drifts hit every mode.
Reported per mode (mean and range over --repeats runs): trained completions, completions/s in the loop (sum
of per-iteration seconds, evaluations left out), mean reward over the last quarter, held-out pass@1, held-out
pass@1 gained per hour of loop wall time, staleness, carried share and wasted tokens, and the ratio of
completions/s to sync's. DIR/rollout_modes.png plots the training reward and held-out pass@1 against trained
completions and against loop wall time (every run, and the mean with its range), the pass@1 gained per hour
and the throughput.

History: until 2026-11-26 the bench ran a toy model taught to count without end after `Count from N:`.
There nothing learnt measurably: at lr 4e-4 held-out pass@1 went 0.148 -> 0.162 (sync) and 0.117 -> 0.102
(partial) in 10 iterations, at lr 1e-3 sync went 0.129 -> 0.127 in 5, and the spread between runs of one
starting model was 0.03, so no mode could be compared with another; hence the pretrained model here. What
those runs did show about partial rollouts: answers carried for up to 6 versions had a trainer-vs-rollout
mismatch of 1.0-1.3 nats/token when trained, and tisCap 2 clipped 6-7% of their tokens.

Pilot runs, 2026-11-26. They showed that 5 iterations were too few for this task to learn clearly. They also
showed that a tokenBudget of 48, below SmolLM2's typical ~72-token answer, made partial carry most sums and
not just the long tail. Hence 8 iterations and a budget of 96. The first asynchronous run found a defect,
since fixed: the rollout client dropped a pod whose connection closed under a request, so that pod missed an
update. Run this bench alone: one run takes ~11-14 GB, and beside other benches it ran out of memory.

Results, 2026-11-26 (bench/results/rollout_modes.json and .png hold the second series). Each run was alone on
2 pinned cores, 8 iterations, a held-out eval of 96 x 4, run k of a mode with spec.seed k.
First series, eval answers cut at 48 tokens (below SmolLM2's ~65-token sums, so brevity counted too), held-out
pass@1 gain: sync 4 runs +0.10..+0.25 (mean +0.16), partial 3 runs +0.22..+0.32 (+0.26), async k=1 4 runs
+0.06..+0.11 (+0.08), async k=2 1 run +0.20, async k=1 terminate 1 run +0.12.
Second series, eval answers up to 128 tokens (the default now), seeds 4-6, start -> end:
    sync          0.122->0.323, 0.122->0.266, 0.133->0.281   gain +0.14..+0.20 (mean +0.16)
    async k=1     0.125->0.164, 0.156->0.318, 0.122->0.281   gain +0.04..+0.16 (mean +0.12)
    sync delayed  0.122->0.263, 0.122->0.247, 0.133->0.229   gain +0.10..+0.14 (mean +0.12)
Paired by seed, final pass@1 minus sync's: async k=1 -0.159, +0.052, +0.000; sync delayed -0.060, -0.018, -0.052.

What they show:
- Partial rollouts learned at least as well as sync (first series: every run above sync's mean).
- Async k=1 matched sync in two of three runs of the second series; the third (seed 4) stopped learning
  (entropy up from 2.5 to 2.8-3.0, training reward flat). Its mean gain is about a quarter below sync's.
- The diagnostic `sync delayed` (sources.DelayedSource: async k=1's one-version staleness, none of its
  producer) learned less than sync on every seed, and as much as async k=1 on average: the cost is the
  staleness, not the machinery. Samples were 0.01-0.03 nats/token off the trainer's and tisCap 2 clipped none.
- The diagnostic `async k=1 terminate` (only the rollout-only pod generates) learned like k=1 with keep.
- Throughput: async k=1 1.18x sync's completions/s; on 2 pinned cores the trainer bounds this loop.

Not a test. Run (about 16-18 minutes per mode and run on 2 idle cores with --iterations 8 --eval-every 8,
evaluations and start-up included; split a long series over sittings with --resume). The second series was
    ~/.cache/tandem/venv/bin/python bench/rollout_modes.py --modes "sync,async k=1,sync delayed" --seeds 4,5,6 \
        --resume --iterations 8 --eval-every 8 --out DIR
Options: [--no-pin-pods] [--repeats N | --seeds S,...] [--modes ...] [--resume] [--iterations N] [--prompts N]
        [--lr X] [--batch N] [--eval-samples N] [--eval-max-tokens N] [--eval-every N] [--out DIR]
It prints a table and writes DIR/rollout_modes.json (default DIR: /tmp/tandem-bench/rollout_modes).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from statistics import mean
from typing import Any

import arith_heldout  # bench/: the 96 held-out prompts

ROOT = Path(__file__).resolve().parents[1]
ROOTS = ("operator", "sidecars", "spec", "checkpoint_engine")
JOB = "bench-rollout-modes"
LONG_SHARE = 8  # every 8th training prompt asks for a long list (its answers run to rollout.maxTokens)
MAX_TOKENS = 128
ITERATIONS, PROMPTS, GROUP, LR, BATCH = 10, 8, 4, 1e-5, 32
MODES: dict[str, dict[str, Any]] = {
    "sync": {},
    "partial": {"rollout": {"partial": {"tokenBudget": 96, "maxAge": 4}}},  # above the typical sum answer (~72)
    "async k=1": {"algorithm": {"maxStaleness": 1}},
    "async k=2": {"algorithm": {"maxStaleness": 2}},
    # a diagnostic: the hybrid pod's vLLM stopped while the trainer trains, so only the rollout-only pod
    # generates batches (no shared rollouts on the trainer's core)
    "async k=1 terminate": {"algorithm": {"maxStaleness": 1}, "rollout": {"betweenRollouts": "terminate"}},
    # a diagnostic: the synchronous loop training each batch one version after it was generated (async k=1's
    # staleness without its producer thread; sources.DelayedSource)
    "sync delayed": {"spec": {"podTemplate": {"spec": {"containers": [
        {"name": "trainer", "env": [{"name": "DIAGNOSTIC_DELAYED_BATCHES", "value": "1"}]}]}}}},
}


class RunFailed(RuntimeError):
    pass


def long_prompt(n: int) -> dict[str, Any]:
    """A prompt SmolLM2 answers at length (a numbered list), rewarded 0: its answer is no sum."""
    return {"messages": [{"role": "user", "content": f"List the numbers from {n} to {n + 60}, one per line."}],
            "answer": -1}


def build_task(out: Path) -> tuple[Path, Path, Path]:
    """(model dir, train.jsonl, test.jsonl): SmolLM2-135M-Instruct, examples/arith's 57 training sums with
    every LONG_SHARE-th prompt a long list, and the 24 held-out sums in each of 4 phrasings (96 prompts)."""
    from tandem.cli import pretrained

    model = pretrained.fetch("smollm2-135m")
    arith = ROOT / "examples" / "arith"
    rows = [json.loads(x) for x in (arith / "train.jsonl").read_text().splitlines() if x.strip()]
    train_rows: list[dict[str, Any]] = []
    for i, row in enumerate(rows):
        if i % (LONG_SHARE - 1) == LONG_SHARE - 2:
            train_rows.append(long_prompt(i))
        train_rows.append(row)
    train = out / "train-long-tail.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in train_rows))
    return Path(model), train, arith_heldout.write(out)


def job_yaml(mode: str, model: Path, train: Path, test: Path, path: Path, *, iterations: int, prompts: int,
             lr: float, batch: int, eval_samples: int, seed: int, eval_max_tokens: int = MAX_TOKENS,
             eval_every: int | None = None) -> Path:
    """The mode's job: examples/smollm2-grpo.yaml's, with answers up to MAX_TOKENS long; spec.eval scores the
    96 held-out prompts (`eval_samples` samples at temperature 1) at the start, the middle and the end.
    `seed` (spec.seed: the prompt order and every sampler) is the run's number, the same for each mode."""
    import yaml

    algorithm: dict[str, Any] = {"name": "grpo", "groupSize": GROUP, "klCoef": 0.0, "clip": 0.2, "lr": lr,
                                 "iterations": iterations, "tisCap": 2.0}
    rollout: dict[str, Any] = {"tensorParallel": 1, "maxTokens": MAX_TOKENS, "temperature": 1.0,
                               "promptsPerIteration": prompts, "betweenRollouts": "keep"}
    algorithm |= MODES[mode].get("algorithm", {})
    rollout |= MODES[mode].get("rollout", {})
    spec = {"apiVersion": "tandem.dev/v1alpha1", "kind": "RLHFJob", "metadata": {"name": JOB},
            "spec": {"model": {"path": str(model)}, "seed": seed,
                     "dataset": {"path": str(train), "promptField": "messages", "answerField": "answer"},
                     "algorithm": algorithm,
                     "eval": {"dataset": {"path": str(test), "promptField": "messages"},
                              "every": eval_every or max(1, iterations // 2), "prompts": 96,
                              "samples": eval_samples, "temperature": 1.0, "maxTokens": eval_max_tokens},
                     "replicas": 1, "rolloutOnlyReplicas": 1, "gpusPerPod": 0,
                     "trainer": {"tensorParallel": 1, "pipelineParallel": 1, "globalBatchSize": batch,
                                 "microBatchSize": 8, "microBatchTokens": 512, "offload": False},
                     "rollout": rollout, "rewards": [{"type": "answerMatch", "match": "flexible", "weight": 1.0}],
                     "checkpointEngine": {"shmSize": "2Gi", "transport": "tcp", "shardSizeMiB": 256},
                     "failurePolicy": {"maxRestarts": 0}}}
    spec["spec"] |= MODES[mode].get("spec", {})
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def run_mode(mode: str, job: Path, workdir: Path, pin_pods: bool) -> dict[str, Any]:
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(ROOT / r) for r in ROOTS)}
    with open(workdir / "tandem-run.log", "w") as f:
        argv = [sys.executable, "-m", "tandem.cli.main", "run", str(job), "--workdir", str(workdir)]
        t0 = time.perf_counter()
        rc = subprocess.run(argv + (["--pin-pods"] if pin_pods else []),
                            cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, check=False).returncode
        wall = time.perf_counter() - t0
    path = workdir / JOB / "metrics.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
    evals_path = workdir / JOB / "eval.jsonl"
    evals = [json.loads(x) for x in evals_path.read_text().splitlines() if x.strip()] if evals_path.exists() else []
    if rc != 0 or not rows:
        raise RunFailed(f"{mode}: tandem run failed (rc={rc}); see {workdir / 'tandem-run.log'}")
    done, seconds, curve, cum = 0, 0.0, [], [(0, 0.0)]
    for r in rows:  # the loop without its evaluations (the same held-out work in every mode)
        done += r["completions"]
        seconds += r["total_seconds"] - r["seconds"].get("eval", 0.0)
        curve.append((done, r["reward_mean"]))
        cum.append((done, seconds))
    last = rows[-max(1, len(rows) // 4):]
    hist: dict[str, int] = {}
    for r in rows:
        for k, v in r.get("staleness_hist", {}).items():
            hist[k] = hist.get(k, 0) + v
    # an evaluation at iteration i scores the weights after i iterations: (i, completions, loop s, pass@1, pass@k)
    points = [(e["iteration"], *cum[min(e["iteration"], len(rows))], e["pass_at_1"], e["pass_at_k"]) for e in evals]
    return {"completions": done, "loop_seconds": seconds, "completions_per_s": done / seconds,
            "wall_seconds": wall, "reward_last": sum(r["reward_mean"] for r in last) / len(last), "curve": curve,
            "eval": points, "staleness_hist": hist,
            "carried_share": sum(r.get("carried_share", 0.0) for r in rows) / len(rows),
            "wasted_tokens": sum(r.get("wasted_tokens", 0) for r in rows),
            "completion_len": sum(r["completion_tokens"] for r in rows) / done,
            "reward_curve": [r["reward_mean"] for r in rows],  # per iteration, for paired comparisons
            "mismatch": [r.get("mismatch_mean") for r in rows],  # |log p_trainer - log p_rollout| per token
            "rollout_s": sum(r["seconds"]["rollout"] for r in rows) / len(rows),
            "train_s": sum(r["seconds"]["train"] for r in rows) / len(rows)}


def per_hour(run: dict[str, Any]) -> float:
    """Held-out pass@1 gained (last evaluation minus the first) per hour of loop wall time."""
    return (run["eval"][-1][3] - run["eval"][0][3]) / (run["eval"][-1][2] / 3600) if run["eval"] else 0.0


def plot(results: dict[str, list[dict[str, Any]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ((a, e, w), (m, h, b)) = plt.subplots(2, 3, figsize=(17, 9))
    modes = list(results)
    for n, (mode, runs) in enumerate(results.items()):
        color = f"C{n}"
        for k, r in enumerate(runs):
            xs, ys = zip(*r["curve"], strict=True)
            a.plot(xs, ys, marker=".", color=color, alpha=0.6, label=mode if k == 0 else None)
            if r["eval"]:
                _, done, secs, p1, _ = zip(*r["eval"], strict=True)
                e.plot(done, p1, marker="o", color=color, alpha=0.6, label=mode if k == 0 else None)
                w.plot(secs, p1, marker="o", color=color, alpha=0.6, label=mode if k == 0 else None)
        points = [r["eval"] for r in runs if r["eval"]]
        if points and all(len(p) == len(points[0]) for p in points):
            trained = [mean(p[i][1] for p in points) for i in range(len(points[0]))]
            p1s = [[p[i][3] for p in points] for i in range(len(points[0]))]
            m.plot(trained, [mean(x) for x in p1s], marker="o", color=color, label=mode)
            m.fill_between(trained, [min(x) for x in p1s], [max(x) for x in p1s], color=color, alpha=0.15)
    a.set(xlabel="trained completions", ylabel="training reward mean", title="training reward")
    e.set(xlabel="trained completions", ylabel="held-out pass@1 (T=1)", title="held-out pass@1 vs trained completions")
    w.set(xlabel="loop wall seconds (without evaluations)", ylabel="held-out pass@1 (T=1)",
          title="held-out pass@1 vs wall time")
    m.set(xlabel="trained completions", ylabel="held-out pass@1 (T=1)",
          title="held-out pass@1: mean over runs, band: range")
    for ax in (a, e, w, m):
        ax.legend()
    for ax, key, label, title in ((h, per_hour, "held-out pass@1 gained per hour of loop wall time",
                                   "what users care about: pass@1 per hour"),
                                  (b, lambda r: r["completions_per_s"], "completions/s (loop, without eval)",
                                   "throughput")):
        ax.bar(modes, [mean([key(r) for r in results[x]]) for x in modes], color=[f"C{i}" for i in range(len(modes))])
        for i, x in enumerate(modes):
            ax.scatter([i] * len(results[x]), [key(r) for r in results[x]], color="k", zorder=3)
        ax.set(ylabel=label, title=title + " (bars: mean, dots: runs)")
    fig.tight_layout()
    fig.savefig(path)


def paired(results: dict[str, list[dict[str, Any]]]) -> None:
    """Each mode's final held-out pass@1 and last-quarter reward minus sync's, run by run where the two runs
    share a seed (the same prompt order): differences between runs of one seed are less noisy than means."""
    sync = results.get("sync", [])
    for mode, runs in results.items():
        if mode == "sync":
            continue
        pairs = [(r, s) for r, s in zip(runs, sync, strict=False) if r["eval"] and s["eval"]
                 and r.get("seed", 0) == s.get("seed", 0)]
        if pairs:
            d1 = [r["eval"][-1][3] - s["eval"][-1][3] for r, s in pairs]
            dr = [r["reward_last"] - s["reward_last"] for r, s in pairs]
            print(f"{mode} minus sync, paired by seed {[r.get('seed', 0) for r, _ in pairs]}: held-out pass@1 "
                  f"{' '.join(f'{x:+.3f}' for x in d1)} (mean {mean(d1):+.3f}); reward, last quarter "
                  f"{' '.join(f'{x:+.3f}' for x in dr)} (mean {mean(dr):+.3f})")


def reward_curves(results: dict[str, list[dict[str, Any]]]) -> None:
    """Each mode's training reward per iteration, the mean over its runs, and the same with mismatch (mean
    |log p_trainer - log p_rollout| per token): a mode whose samples lag by k versions should trail sync's
    curve by about k iterations, no more."""
    for mode, runs in results.items():
        curves = [r["reward_curve"] for r in runs if r.get("reward_curve")]
        if not curves:
            continue
        n = min(len(c) for c in curves)
        line = " ".join(f"{mean(c[i] for c in curves):.2f}" for i in range(n))
        gaps = [x for r in runs for x in r.get("mismatch", []) if x is not None]
        gap = f"; mismatch {min(gaps):.4f}-{max(gaps):.4f} nats/token" if gaps else ""
        print(f"{mode:<20} reward per iteration (mean of {len(curves)}): {line}{gap}")


def spread(xs: list[float], digits: int = 3) -> str:
    f = f"{{:.{digits}f}}"
    return f.format(mean(xs)) if len(xs) == 1 else f"{f.format(mean(xs))} ({f.format(min(xs))}-{f.format(max(xs))})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iterations", type=int, default=ITERATIONS)
    ap.add_argument("--prompts", type=int, default=PROMPTS, help=f"rollout.promptsPerIteration (x {GROUP} completions)")
    ap.add_argument("--lr", type=float, default=LR)
    ap.add_argument("--batch", type=int, default=BATCH, help="trainer.globalBatchSize (optimizer steps per iteration: "
                    f"prompts x {GROUP} / batch)")
    ap.add_argument("--out", type=Path, default=Path("/tmp/tandem-bench/rollout_modes"))
    ap.add_argument("--eval-samples", type=int, default=4, help="samples per held-out prompt (96 prompts)")
    ap.add_argument("--eval-max-tokens", type=int, default=MAX_TOKENS,
                    help="held-out answers' token limit (below an answer's length, pass@1 rewards brevity)")
    ap.add_argument("--eval-every", type=int, default=None, help="iterations between evaluations "
                    "(default: half the run: start, middle, end)")
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of " + ", ".join(MODES))
    ap.add_argument("--repeats", type=int, default=1, help="runs per mode, interleaved (sync, partial, ..., sync, ...)")
    ap.add_argument("--seeds", default=None, help="comma-separated spec.seed of each run (default: 0 .. repeats-1); "
                    "with --resume a mode's run of a seed already saved is not run again")
    ap.add_argument("--resume", action="store_true", help="keep the runs already in DIR/rollout_modes.json and "
                    "run only the missing ones (a long bench split over several sittings)")
    ap.add_argument("--pin-pods", action=argparse.BooleanOptionalAction, default=True,
                    help="each pod on its own cores (tandem run --pin-pods), as on separate nodes (default)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    print("building the long-tailed task (cached)", flush=True)
    model, train, test = build_task(args.out)
    modes = args.modes.split(",")
    results: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    saved = args.out / "rollout_modes.json"
    others: dict[str, list[dict[str, Any]]] = {}  # saved runs of modes not asked for: written back untouched
    if args.resume and saved.exists():
        kept = json.loads(saved.read_text())
        results |= {m: runs for m, runs in kept.items() if m in modes}
        others = {m: runs for m, runs in kept.items() if m not in modes}
        print("kept " + ", ".join(f"{m}: {len(r)}" for m, r in results.items()), flush=True)
    run_seeds = [int(x) for x in args.seeds.split(",")] if args.seeds else list(range(args.repeats))
    for n, k in enumerate(run_seeds):
        for mode in modes:
            done = any(r.get("seed", 0) == k for r in results[mode]) if args.seeds else n < len(results[mode])
            if done:
                continue
            print(f"running {mode} (seed {k}, {n + 1}/{len(run_seeds)})", flush=True)
            slug = mode.replace(" ", "").replace("=", "")
            job = job_yaml(mode, model, train, test, args.out / f"{slug}.yaml", iterations=args.iterations,
                           prompts=args.prompts, lr=args.lr, batch=args.batch,
                           eval_samples=args.eval_samples, seed=k, eval_max_tokens=args.eval_max_tokens,
                           eval_every=args.eval_every)
            for attempt in range(3):  # a run the machine's load broke (an etcd lease lost) is run again
                try:
                    results[mode].append(run_mode(mode, job, args.out / f"{slug}-{k}", args.pin_pods)
                                         | {"seed": k, "eval_max_tokens": args.eval_max_tokens})
                    saved.write_text(json.dumps(results | others, indent=2))  # so far
                    break
                except RunFailed as e:
                    print(f"  {e}; {'again' if attempt < 2 else 'giving up'}", flush=True)
                    shutil.copytree(args.out / f"{slug}-{k}", args.out / f"{slug}-{k}-failed{attempt}",
                                    dirs_exist_ok=True, ignore=shutil.ignore_patterns("etcd"))
            else:
                raise SystemExit(f"{mode}: three runs failed")
    base = mean([r["completions_per_s"] for r in results.get("sync", next(iter(results.values())))])
    print(f"{'mode':<10} {'trained':>7} {'compl/s':>17} {'ratio':>5} {'reward(last 1/4)':>20} "
          f"{'held-out pass@1 start -> middle -> end (range)':>48} {'pass@1/h':>17} {'len':>5} {'rollout s':>9} "
          f"{'train s':>7} {'carried':>7} {'wasted':>6}  staleness, seeds")
    for mode, runs in results.items():
        cps = [r["completions_per_s"] for r in runs]
        evals = "-"
        if all(r["eval"] for r in runs):
            p1 = [[p[3] for p in r["eval"]] for r in runs]
            mid = f"{mean(x[len(x) // 2] for x in p1):.3f} -> " if min(len(x) for x in p1) > 2 else ""
            evals = f"{mean(x[0] for x in p1):.3f} -> {mid}{spread([x[-1] for x in p1])}"
        hour = spread([per_hour(r) for r in runs], 1)
        print(f"{mode:<10} {runs[0]['completions']:>7} {spread(cps, 1):>17} {mean(cps) / base:>5.2f} "
              f"{spread([r['reward_last'] for r in runs]):>20} {evals:>48} {hour:>17} "
              f"{mean([r['completion_len'] for r in runs]):>5.1f} {mean([r['rollout_s'] for r in runs]):>9.2f} "
              f"{mean([r['train_s'] for r in runs]):>7.2f} {mean([r['carried_share'] for r in runs]):>7.2f} "
              f"{sum(r['wasted_tokens'] for r in runs) // len(runs):>6}  {runs[0]['staleness_hist']}  "
              f"seeds {[r.get('seed', 0) for r in runs]}")
    paired(results)
    reward_curves(results)
    saved.write_text(json.dumps(results | others, indent=2))
    plot(results, args.out / "rollout_modes.png")
    print(f"wrote {args.out / 'rollout_modes.json'} and {args.out / 'rollout_modes.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
