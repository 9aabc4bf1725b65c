"""Algorithm benchmark: GRPO vs DAPO vs Dr. GRPO vs GSPO vs RLOO on the SmolLM2 task, side by side.

Every algorithm runs `tandem run` on examples/smollm2-grpo.yaml's task: SmolLM2-135M-Instruct (fetched
by `tandem models fetch smollm2-135m`, cached) learns chat-format single-digit sums (examples/arith,
answerMatch `flexible`), group 4, 8 prompts per iteration, <= 48 tokens at temperature 1, lr 1e-5,
klCoef 0, the same iterations and the same seeded prompt order. Only `algorithm.preset` differs
(grpo: none; dapo, dr_grpo, gspo, rloo: spec/tandem/spec/algorithm.py's PRESETS fill what the job leaves
out, so the job sets no clip: grpo/dr_grpo/rloo clip 0.2, dapo 0.2/0.28, gspo 3e-4/4e-4). klCoef 0 is
the demo's and held for all: rloo's preset leaves it at the default 0.001 (its KL k1 in the reward), which
here is off, as it is for the other presets (theirs is 0), so no reference model runs in any of them.
Two more variants of grpo compare the engines (--algorithms grpo,grpo-hf,grpo-lora16): grpo-hf trains the
same model on the hf engine (transformers + FSDP2; grpo itself runs Megatron, which auto picks for SmolLM2),
grpo-lora16 trains LoRA adapters (rank 16, alpha 32, every linear layer) at lr 1e-4, adapters' usual ~10x.
DAPO's dynamic sampling drops groups whose rewards all tie and generates up to 2 more rounds of 8 prompts:
it trains on at most the same 32 completions per iteration but generates more (reported: extra rounds,
generated completions) and may train on fewer when the rounds run out. Its training reward (reward_mean:
the task reward before its overlong shaping of the last fifth of 48 tokens) is its kept groups' only, so it
reads higher than the others' for the same policy; held-out pass@1 compares all alike.

Measured per algorithm: trained completions (metrics.jsonl `completions`), wall seconds of `tandem run`
(start-up and evaluations included), held-out pass@1 at the start, the middle and the end (spec.eval: all
24 prompts of examples/arith/test.jsonl, the only held-out sums there are, 4 samples each at temperature 1:
96 answers per evaluation, the same prompts for every algorithm; --eval-samples 8 doubles them for ~100 s
more a run), and the training reward mean over the first and the last quarter of the iterations. The
eval's standard error is the binomial sqrt(p(1-p)/(24 x samples)):
with the prompts fixed (as they are, for every algorithm) it bounds the sampling noise of one evaluation
from above; it does not cover the spread between training runs (CPU sampling is not seeded: two runs of
one algorithm differ), which --repeats measures. These are 10-iteration runs of a 135M model on 57
training sums, not the papers' scales: differences within ~2 standard errors mean nothing, and the
presets' own motivations (long reasoning chains, MoE routing, entropy collapse) barely arise here.

Not a test. Run (about 8-9 minutes per algorithm and run on 2 cores; 5 runs ~45 min):
    /root/.cache/tandem/venv/bin/python bench/algorithms.py [--algorithms grpo,dapo,...] [--iterations N]
        [--repeats N] [--eval-samples N] [--out DIR] [--keep]
It prints a table and writes DIR/algorithms.json and DIR/algorithms.png (held-out pass@1 with its standard
error, and the training reward, against trained completions; default DIR: /tmp/tandem-bench/algorithms).

Measured 2026-11-25/26 (2 cores shared with other jobs all along: load average 8-60, so wall seconds
compare nothing), 10 iterations, one run each, pass@1 +- the binomial standard error of its 96 answers:
    algorithm trained wall s  pass@1 start  pass@1 mid    pass@1 end    reward 1st/4 last/4  len   extra rounds
    grpo      320     2292    0.094+-0.030  0.260+-0.045  0.396+-0.050  0.156  0.469       37.3  -
    dapo      320     1546    0.135+-0.035  0.292+-0.046  0.417+-0.050  0.281  0.375       28.1  12 (704 generated)
    dr_grpo   320      966    0.135+-0.035  0.219+-0.042  0.427+-0.050  0.156  0.359       32.4  -
    gspo      320     1077    0.135+-0.035  0.271+-0.045  0.625+-0.049  0.125  0.547       35.4  -
    rloo      320      965    0.094+-0.030  0.302+-0.047  0.344+-0.048  0.156  0.422       32.2  -
Every recipe learns here (held-out pass@1 ~0.1 -> 0.34-0.63 in 320 trained completions). GSPO ended highest,
0.2 above the next (Dr. GRPO 0.427): about 3 standard errors of that difference (0.07); GRPO, DAPO, Dr.
GRPO and RLOO end within 0.08 of each other, inside the noise. One run each: the spread between runs
(the same start scored 0.094 and 0.135) is not measured, so even GSPO's lead is a lead of one run
(`--repeats 3` measures it). Nor is it GSPO's clipping: with one gradient step per rollout every ratio
is 1 and no clip ever binds (clip_frac 0 in every run), so here GSPO differs from GRPO by its aggregation
(seq-mean-token-mean: each answer weighs the same, short ones no less) and what this shows is that
aggregation's effect on this task. Dr. GRPO's unnormalised loss gives gradients about half the others'
(grad norm 0.52 vs 1.1-2.5, clipped at 1): at the same lr its steps are smaller.
DAPO generated 704 completions to train on 320 (12 extra rounds over 10 iterations: its flat groups
dropped) and trains on shorter answers (overlong shaping). Two earlier DAPO runs died on a machine at load
50-60: vLLM, starved of CPU, hit its 300 s model-step timeout, and then the OOM killer took its worker
(dmesg); the rollout now allows vLLM an hour.

Measured 2026-11-26 (2 idle cores), the engines, one run each, 10 iterations, pass@1 +- its standard error:
    variant      engine    trained wall s  pass@1 start  pass@1 mid    pass@1 end    reward last/4  train s/it
    grpo         megatron  320     480     0.135+-0.035  0.198+-0.041  0.438+-0.051  0.359          20.3
    grpo-hf      hf        320     429     0.135+-0.035  0.208+-0.041  0.354+-0.049  0.406          17.5
    grpo-lora16  hf+LoRA   320     407     0.135+-0.035  0.229+-0.043  0.250+-0.044  0.203          15.4
Both full engines learn (0.14 -> 0.35-0.44; their 0.08 apart is ~1.2 standard errors of the difference, one
run each: the unit tests show their steps equal). LoRA r16 at lr 1e-4 learns less in these 320 completions
(0.25, training reward 0.20 in the last quarter vs 0.36-0.41): at this budget adapters lag full fine-tuning;
a higher lr or more iterations is the next thing to try. Its versions are whole (merged), so its sync costs
the same (publish + sync 1.7-1.9 s per iteration in all three).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from statistics import mean
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ROOTS = ("operator", "sidecars", "spec", "checkpoint_engine")
JOB = "bench-algorithms"
ARITH = ROOT / "examples" / "arith"  # examples/smollm2-grpo.yaml's task: chat rows, held-out test.jsonl (24 sums)
ALGORITHMS: dict[str, str | None] = {"grpo": None, "dapo": "dapo", "dr_grpo": "dr_grpo", "gspo": "gspo",
                                     "rloo": "rloo", "grpo-hf": None, "grpo-lora16": None}  # name -> preset
LORA = {"grpo-lora16": ({"rank": 16, "alpha": 32}, 1e-4)}  # trainer.lora and its lr (adapters take ~10x full FT's)
GROUP, PROMPTS, MAX_TOKENS, LR = 4, 8, 48, 1e-5  # examples/smollm2-grpo.yaml
EVAL_PROMPTS, EVAL_SAMPLES = 24, 4  # test.jsonl has 24 sums (--eval-samples 8: 192 answers, +~100 s a run)


def env() -> dict[str, str]:
    """The sidecars and the CLI run from the same tree as this script (the rollout itself raises vLLM's
    model-step timeout, which a step on shared cores has outlasted)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(str(ROOT / r) for r in ROOTS)}


def fetch_model() -> Path:
    """`tandem models fetch smollm2-135m`: its cached HF directory (downloaded and converted once)."""
    out = subprocess.run([sys.executable, "-m", "tandem.cli.main", "models", "fetch", "smollm2-135m"], cwd=ROOT,
                         env=env(), stdout=subprocess.PIPE, text=True, check=True).stdout
    return Path(out.strip().splitlines()[-1])


def job_yaml(algorithm: str, model: Path, iterations: int, path: Path, samples: int = EVAL_SAMPLES) -> Path:
    """The algorithm's job: examples/smollm2-grpo.yaml's, with `preset` and spec.eval at 0, the middle and the end."""
    import yaml

    lora, lr = LORA.get(algorithm, (None, LR))
    spec_algorithm: dict[str, Any] = {"name": "grpo", "groupSize": GROUP, "klCoef": 0.0, "lr": lr,
                                      "iterations": iterations}
    if ALGORITHMS[algorithm]:
        spec_algorithm["preset"] = ALGORITHMS[algorithm]
    spec = {"apiVersion": "tandem.dev/v1alpha1", "kind": "RLHFJob", "metadata": {"name": JOB},
            "spec": {"model": {"path": str(model)},
                     "dataset": {"path": str(ARITH / "train.jsonl"), "promptField": "messages",
                                 "answerField": "answer"},
                     "eval": {"dataset": {"path": str(ARITH / "test.jsonl"), "promptField": "messages"},
                              "every": max(1, iterations // 2), "prompts": EVAL_PROMPTS, "samples": samples,
                              "temperature": 1.0},
                     "algorithm": spec_algorithm,
                     "replicas": 1, "gpusPerPod": 0,
                     # a CPU pod has nothing to free between phases (the state would move RAM to RAM)
                     "trainer": {"tensorParallel": 1, "pipelineParallel": 1, "globalBatchSize": 32,
                                 "microBatchSize": 8, "microBatchTokens": 512, "offload": False}
                     | ({"lora": lora} if lora else {}) | ({"engine": "hf"} if algorithm == "grpo-hf" else {}),
                     "rollout": {"tensorParallel": 1, "maxTokens": MAX_TOKENS, "temperature": 1.0,
                                 "promptsPerIteration": PROMPTS, "betweenRollouts": "keep"},
                     "rewards": [{"type": "answerMatch", "match": "flexible", "weight": 1.0}],
                     "checkpointEngine": {"shmSize": "2Gi", "transport": "tcp", "shardSizeMiB": 256},
                     "failurePolicy": {"maxRestarts": 0}}}
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def stderr(p: float, n: int) -> float:
    """Binomial standard error of a pass rate over n answers (an upper bound with the prompts fixed)."""
    return math.sqrt(max(p * (1 - p), 0.0) / n)


def run_algorithm(algorithm: str, job: Path, workdir: Path) -> dict[str, Any]:
    """One `tandem run`; its metrics, or {"error": ...} with the log's tail when it failed."""
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    log = workdir / "tandem-run.log"
    t0 = time.perf_counter()
    with open(log, "w") as f:
        rc = subprocess.run([sys.executable, "-m", "tandem.cli.main", "run", str(job), "--workdir", str(workdir)],
                            cwd=ROOT, env=env(), stdout=f, stderr=subprocess.STDOUT, check=False).returncode
    wall = time.perf_counter() - t0
    rows, evals = (read_jsonl(workdir / JOB / f) for f in ("metrics.jsonl", "eval.jsonl"))
    if rc != 0 or not rows:
        tail = log.read_text(errors="replace").splitlines()[-40:]
        return {"error": f"tandem run failed (rc={rc}, {len(rows)} iterations); see {log}", "log_tail": tail,
                "wall_seconds": wall}
    done, curve, at = 0, [], {0: 0}  # trained completions after each iteration
    for r in rows:
        done += r["completions"]
        curve.append((done, r["reward_mean"]))
        at[len(curve)] = done  # eval.jsonl's iteration: iterations completed when evaluated
    quarter = max(1, len(rows) // 4)
    rounds = [r.get("dynamic_rounds", 1) for r in rows]
    generated = sum(n * PROMPTS * GROUP for n in rounds)
    return {"completions": done, "wall_seconds": wall, "iterations": len(rows),
            "loop_seconds": sum(r["total_seconds"] - r["seconds"].get("eval", 0.0) for r in rows),
            "reward_first": mean(r["reward_mean"] for r in rows[:quarter]),
            "reward_last": mean(r["reward_mean"] for r in rows[-quarter:]), "curve": curve,
            "eval": [{"iteration": e["iteration"], "completions": at.get(e["iteration"], done),
                      "pass_at_1": e["pass_at_1"], "stderr": stderr(e["pass_at_1"], e["prompts"] * e["samples"]),
                      "pass_at_k": e["pass_at_k"], "k": e["samples"]} for e in evals],
            "extra_rounds": sum(rounds) - len(rounds), "generated": generated,
            "kept_groups": sum(r.get("dynamic_kept_groups", PROMPTS) for r in rows),
            "dropped_groups": sum(r.get("dynamic_dropped_groups", 0) for r in rows),
            "completion_len": sum(r.get("completion_tokens", 0) for r in rows) / max(done, 1),
            "engine": rows[0].get("engine"), "train_s": mean(r["seconds"].get("train", 0.0) for r in rows),
            "sync_s": mean(r["seconds"].get("sync", 0.0) + r["seconds"].get("publish", 0.0) for r in rows)}


def plot(results: dict[str, list[dict[str, Any]]], path: Path, samples: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (e, a) = plt.subplots(1, 2, figsize=(13, 4.5))
    for n, (algorithm, runs) in enumerate(results.items()):
        color = f"C{n}"
        for k, r in enumerate(x for x in runs if "error" not in x):
            label = algorithm if k == 0 else None
            if r["eval"]:
                e.errorbar([v["completions"] for v in r["eval"]], [v["pass_at_1"] for v in r["eval"]],
                           yerr=[v["stderr"] for v in r["eval"]], marker="o", capsize=3, color=color, alpha=0.8,
                           label=label)
            xs, ys = zip(*r["curve"], strict=True)
            a.plot(xs, ys, marker=".", color=color, alpha=0.8, label=label)
    e.set(xlabel="trained completions", ylabel="held-out pass@1 (T=1, +-1 s.e.)",
          title=f"held-out sums ({EVAL_PROMPTS} prompts x {samples} samples)")
    a.set(xlabel="trained completions", ylabel="training reward mean", title="training reward (dapo: kept groups only)")
    e.legend()
    a.legend()
    fig.tight_layout()
    fig.savefig(path)


def spread(xs: list[float]) -> str:
    return f"{mean(xs):.3f}" if len(xs) == 1 else f"{mean(xs):.3f} ({min(xs):.3f}-{max(xs):.3f})"


def table(results: dict[str, list[dict[str, Any]]]) -> str:
    head = (f"{'algorithm':<9} {'trained':>7} {'wall s':>6} {'pass@1 start':>13} {'pass@1 mid':>13} "
            f"{'pass@1 end':>13} {'reward 1st/4':>12} {'reward last/4':>13} {'len':>5}  extra rounds (generated)")
    lines = [head]
    for algorithm, runs in results.items():
        for k, r in enumerate(runs):
            name = algorithm if len(runs) == 1 else f"{algorithm}#{k}"
            if "error" in r:
                lines.append(f"{name:<9} FAILED: {r['error']}")
                continue
            ev = [f"{v['pass_at_1']:.3f}+-{v['stderr']:.3f}" for v in r["eval"]]
            ev = (ev + ["-"] * 3)[:3] if len(ev) <= 3 else [ev[0], ev[len(ev) // 2], ev[-1]]
            extra = f"{r['extra_rounds']} ({r['generated']})" if ALGORITHMS[algorithm] == "dapo" else "-"
            lines.append(f"{name:<9} {r['completions']:>7} {r['wall_seconds']:>6.0f} {ev[0]:>13} {ev[1]:>13} "
                         f"{ev[2]:>13} {r['reward_first']:>12.3f} {r['reward_last']:>13.3f} "
                         f"{r['completion_len']:>5.1f}  {extra}")
    for algorithm, runs in results.items():
        ok = [r for r in runs if "error" not in r and r["eval"]]
        if len(ok) > 1:
            end = spread([r["eval"][-1]["pass_at_1"] for r in ok])
            lines.append(f"{algorithm}: pass@1 at the end over {len(ok)} runs {end}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--algorithms", default="grpo,dapo,dr_grpo,gspo,rloo",
                    help="comma-separated subset of " + ", ".join(ALGORITHMS))
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=1,
                    help="runs per algorithm, interleaved (grpo, dapo, ..., grpo, ...)")
    ap.add_argument("--eval-samples", type=int, default=EVAL_SAMPLES,
                    help=f"samples per held-out prompt ({EVAL_PROMPTS} prompts) at each evaluation")
    ap.add_argument("--out", type=Path, default=Path("/tmp/tandem-bench/algorithms"))
    ap.add_argument("--keep", action="store_true",
                    help="reuse the runs DIR/algorithms.json holds that succeeded with these iterations and eval "
                         "samples (run again only the failed or missing ones)")
    args = ap.parse_args(argv)
    algorithms = args.algorithms.split(",")
    unknown = [a for a in algorithms if a not in ALGORITHMS]
    if unknown:
        ap.error(f"unknown algorithms {unknown}; known: {', '.join(ALGORITHMS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    print("fetching smollm2-135m (cached after the first time)", flush=True)
    model = fetch_model()
    results: dict[str, list[dict[str, Any]]] = {a: [] for a in algorithms}
    old = json.loads((args.out / "algorithms.json").read_text()) if args.keep and (
        args.out / "algorithms.json").exists() else {}
    for k in range(args.repeats):
        for algorithm in algorithms:
            prior = old.get(algorithm, [])[k] if k < len(old.get(algorithm, [])) else {}
            if "error" not in prior and prior.get("iterations") == args.iterations and prior.get("eval") and all(
                    v["k"] == args.eval_samples for v in prior["eval"]):
                print(f"kept {algorithm} ({k + 1}/{args.repeats}) from {args.out / 'algorithms.json'}", flush=True)
                results[algorithm].append(prior)
                continue
            print(f"running {algorithm} ({k + 1}/{args.repeats})", flush=True)
            job = job_yaml(algorithm, model, args.iterations, args.out / f"{algorithm}.yaml", args.eval_samples)
            r = run_algorithm(algorithm, job, args.out / f"{algorithm}-{k}")
            results[algorithm].append(r)
            print(f"  {algorithm}: " + (r["error"] if "error" in r else
                  f"{r['completions']} trained completions in {r['wall_seconds']:.0f} s, pass@1 "
                  + " -> ".join(f"{v['pass_at_1']:.3f}" for v in r["eval"])), flush=True)
            (args.out / "algorithms.json").write_text(json.dumps(results, indent=2))  # partial results as it goes
    print(table(results))
    (args.out / "algorithms.json").write_text(json.dumps(results, indent=2))
    plot(results, args.out / "algorithms.png", args.eval_samples)
    print(f"wrote {args.out / 'algorithms.json'} and {args.out / 'algorithms.png'}")
    return 0 if all("error" not in r for runs in results.values() for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
