"""VLM RL-loop benchmark: Tandem's `tandem run` against TRL's GRPOTrainer on the VLM demo, side by side in one run.

Role: bench/rl_vs_trl.py's comparison on a vision-language model. Both train a fresh copy of the same LLaVA (the
demo's, built from SmolLM2-135M-Instruct: `tandem models fetch llava-smollm2`; `--model` for another) on the VLM
demo's task (name the colour of the circle or the square in a 64x64 picture: tandem.sidecars.vlm_demo, 512
training rows) with examples/vlm-grpo.yaml's settings (bench/vlm_demo.py's `job_for`): group 4, 8 prompts per
iteration, <= 8 tokens at temperature 1, answerMatch flexible, lr 2e-5 constant, Adam without weight decay, grad
clip 1, KL 0, clip 0.2, token-mean loss (TRL loss_type "dapo"), one optimizer step of 32 completions in micro-
batches of 8 per iteration; the trainer's state stays in memory on Tandem's side (trainer.offload false), as it
does in TRL. TRL gets the rows as Tandem's own dataset code reads them (`PromptDataset.load` on the job's
dataset): the same decoded RGB pictures in an `images` column and the same messages, each image part as a
`{"type": "image"}` placeholder; before training, the prompt token ids TRL builds (its `_tokenize_prompts`: the
processor's chat template, the picture's placeholder expanded to its image tokens) and its pixel values are
checked against Tandem's for the first rows (Tandem's ids with each image token expanded as vLLM expands it:
config.image_seq_length tokens; pixel values by the model's image processor, as the trainer prepares them), and
the result printed. Rewards are Tandem's `RewardSet` of the job, wrapped as TRL's one reward function. TRL runs
without gradient checkpointing (its default is on; Tandem's trainer.activationCheckpointing is off). Left as each
does it: TRL keeps the image token out of its samples by `suppress_tokens` in generate alone and scores with the
full softmax; Tandem pushes that logit down both where vLLM samples and where the trainer scores.
Tandem runs as a subprocess (its metrics.jsonl parsed, the export of the last iteration left out of its seconds);
TRL in this process, its loop timed by a callback. After both, bench/rl_vs_trl_eval.py scores the base model,
Tandem's export and TRL's saved model with Tandem's own evaluator on vLLM (96 held-out prompts x 4 samples at
temperature 1), on the pictures (test.jsonl) and blind (test-blind.jsonl: the same questions, the picture taken
out; chance 1/6). Reported (rl_vs_trl.py's `summarize`, then a held-out table): completions/s in the loop and
with start-up for each and their ratio, training reward over the last iterations, pass@1 / pass@4 before and
after on pictures and blind, seconds per iteration by phase. Not a test; needs TRL in the venv (`TRL_HINT`). Run:
    /root/.cache/tandem/venv/bin/python bench/vlm_vs_trl.py [--iterations 15] [--model DIR] [--seed 0]
        [--trl-threads N] [--out DIR] [--results]
It writes DIR/vlm_vs_trl.json (default DIR: /tmp/tandem-bench/vlm_vs_trl), with --results also
bench/results/vlm_vs_trl.json (`summarize` leaves the loop's part in DIR/rl_vs_trl-vlm.json too).

Measured here, 2026-12-08, 2 cores, nothing else running (bench/results/vlm_vs_trl.json; `--iterations 25`,
seed 0, the example's strict reward, groupSize 8): held-out pass@1 with the pictures 0.135 -> Tandem 0.339 (pass@4
0.438) against TRL 0.310 (0.354); blind 0.000 -> 0.000 against 0.003 (chance 0.167). Training reward over the last
5 iterations 0.469 against 0.338. Completions/s in the loop 6.73 against 1.78 (3.77x; 3.23x with start-up):
Tandem's train phase 5.6 s an iteration against TRL's 28.9, its rollout 3.2 s against TRL's generate 7.0.
The run before (2026-12-07, 15 iterations, answerMatch flexible, beside a niced evaluation) scored 0.523 against
0.424, but both policies had learned to list colours (Tandem's trained model, sampled on 24 held-out pictures:
47 of 48 answers named several colours, none was the one-word answer); its Tandem train phase was 17.9 s against
TRL's 14.7 (0.86x).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
import warnings
from pathlib import Path
from typing import Any

import yaml

from rl_vs_trl import TRL_HINT, Size, fresh_copy, job_name, run_eval, run_tandem, summarize
from trl_half import TrlRun
from vlm_demo import CHANCE, job_for

ROOT = Path(__file__).resolve().parents[1]  # (the imports above put Tandem's packages on sys.path)
CHECKED_ROWS = 2  # rows whose TRL prompt ids and pixel values are compared with Tandem's


def tandem_job(out: Path, model: Path, files: dict[str, Path], iterations: int, seed: int) -> tuple[Path, Size]:
    """The demo's job (vlm_demo.job_for) named for this folder, seeded, its trainer state kept in memory, without
    the in-loop eval (the held-out scores come from bench/rl_vs_trl_eval.py for all three models alike); its
    settings as rl_vs_trl's `Size` (what TRL is configured from and `summarize` reports)."""
    job = job_for(out, model, files, iterations)
    spec = job["spec"]
    del spec["eval"]
    job["metadata"]["name"] = job_name(out)
    spec["seed"] = seed
    spec["trainer"]["offload"] = False  # a CPU pod has nothing to free; TRL keeps its state in memory too
    algorithm, rollout, trainer = spec["algorithm"], spec["rollout"], spec["trainer"]
    s = Size(max_tokens=rollout["maxTokens"], prompts=rollout["promptsPerIteration"], iterations=iterations,
             global_batch=trainer["globalBatchSize"], micro_batch=trainer["microBatchSize"],
             group=algorithm["groupSize"], lr=algorithm["lr"], kl=algorithm["klCoef"], clip=algorithm["clip"],
             task="vlm")
    path = out / "job.yaml"
    path.write_text(yaml.safe_dump(job, sort_keys=False))
    return path, s


def eval_jobs(job: Path, files: dict[str, Path], out: Path) -> dict[str, Path]:
    """The job with examples/vlm-grpo.yaml's spec.eval (96 prompts x 4 samples, temperature 1) on each held-out
    file: test.jsonl (pictures) and test-blind.jsonl (blind), for bench/rl_vs_trl_eval.py."""
    settings = yaml.safe_load((ROOT / "examples" / "vlm-grpo.yaml").read_text())["spec"]["eval"]
    base = yaml.safe_load(job.read_text())
    paths = {}
    for name, data in (("pictures", files["test"]), ("blind", files["blind"])):
        scored = {**settings, "every": base["spec"]["algorithm"]["iterations"],
                  "dataset": {"path": str(data), "promptField": "messages"}}
        paths[name] = out / f"eval-{name}.yaml"
        paths[name].write_text(yaml.safe_dump({**base, "spec": {**base["spec"], "eval": scored}}, sort_keys=False))
    return paths


def expanded(ids: list[int], image_token: int, per_image: int) -> list[int]:
    """Prompt ids with each image placeholder as the `per_image` image tokens vLLM's LLaVA processor expands it to."""
    return [t for i in ids for t in ([i] * per_image if i == image_token else [i])]


def check_prompts(trainer: Any, data: Any, prompts: list[Any], model: Path) -> list[dict[str, Any]]:
    """TRL's prompt ids and pixel values (its own `_tokenize_prompts` on rows prepared as its training step prepares
    them) against Tandem's (the dataset's ids, image tokens expanded; the trainer's image processor) for the first
    rows; printed and returned."""
    import numpy as np
    from transformers import AutoConfig, AutoProcessor
    from trl.data_utils import prepare_multimodal_messages

    config = AutoConfig.from_pretrained(model)
    token, per_image = int(config.image_token_index), int(config.image_seq_length)
    image_processor = AutoProcessor.from_pretrained(model).image_processor
    out = []
    for i in range(min(CHECKED_ROWS, len(prompts))):
        row, prompt = data[i], prompts[i]
        ids, _, fields = trainer._tokenize_prompts([prepare_multimodal_messages(row["prompt"], row["images"])])
        trl_ids = [int(t) for t in ids[0]]
        tandem_ids = expanded(list(prompt.token_ids), token, per_image)
        ours = image_processor(images=list(prompt.images), return_tensors="np")["pixel_values"].astype(np.float32)
        theirs = np.asarray(fields["pixel_values"], dtype=np.float32)  # (a list: TRL makes it a tensor to generate)
        diff = float(np.abs(ours - theirs).max()) if ours.shape == theirs.shape else float("inf")
        check = {"row": prompt.index + 1, "trl_tokens": len(trl_ids), "tandem_tokens": len(tandem_ids),
                 "image_tokens": trl_ids.count(token), "ids_equal": trl_ids == tandem_ids,
                 "pixel_values_max_abs_diff": diff, "pixel_values_shape": list(theirs.shape)}
        if not check["ids_equal"]:
            check |= {"trl_ids": trl_ids, "tandem_ids": tandem_ids}
        print(f"prompt check, row {check['row']}: TRL {len(trl_ids)} ids ({check['image_tokens']} image tokens) "
              f"{'==' if check['ids_equal'] else '!='} Tandem's {len(tandem_ids)} (placeholder x{per_image}); "
              f"pixel values {list(theirs.shape)}, max |TRL - Tandem| {diff:g}", flush=True)
        out.append(check)
    return out


def run_trl(s: Size, job: Path, model: Path, out: Path, iterations: int, threads: int | None,
            seed: int) -> dict[str, Any]:
    """TRL's GRPOTrainer on the job's rows (read by Tandem's dataset code), configured and timed as
    rl_vs_trl.run_trl does it (`TrlRun`); the trained model saved (tower names as vLLM loads them) for the
    held-out eval."""
    warnings.filterwarnings("ignore")
    from tandem.sidecars.picture_files import text_of
    from tandem.sidecars.rewards import RewardSet
    from tandem.spec.load import load_job

    spec = load_job(job).spec
    run = TrlRun(RewardSet(spec.rewards), lambda p: text_of(p[-1]["content"]))
    import torch
    from datasets import Dataset

    if threads:
        torch.set_num_threads(threads)
    from transformers import AutoProcessor, AutoTokenizer
    from trl import GRPOTrainer  # type: ignore[attr-defined]

    from tandem.sidecars.trainer.loop.data.dataset import PromptDataset
    from tandem.sidecars.vlm_demo.build import save

    # Tandem's rows: the pictures as its dataset decodes them, the messages with each image part a placeholder
    prompts = PromptDataset.load(spec.dataset, AutoTokenizer.from_pretrained(model)).prompts
    data = Dataset.from_list([{"prompt": p.messages, "images": list(p.images), "answer": p.answer} for p in prompts])
    trainer = GRPOTrainer(model=str(model), reward_funcs=[run.rewards], args=run.config(s, out, iterations, seed),
                          train_dataset=data, processing_class=AutoProcessor.from_pretrained(model))
    checks = check_prompts(trainer, data, prompts, model)
    result: dict[str, Any] = run.train(trainer, iterations)
    saved = out / "model-trl-trained"
    shutil.rmtree(saved, ignore_errors=True)
    save(trainer.model, saved)  # the tower's weights under the names vLLM loads (build.save)
    for f in model.iterdir():  # processor/tokenizer/template/generation files save_pretrained did not write
        if f.is_file() and not (saved / f.name).exists() and f.suffix != ".safetensors":
            shutil.copy(f, saved / f.name)
    return result | {"saved": str(saved), "prompt_check": checks,
                     "parameters": sum(p.numel() for p in trainer.model.parameters())}


def held_out_table(scores: dict[str, dict[str, dict[str, Any]]], iterations: int) -> None:
    """pass@1 / pass@k before (the base model) and after (Tandem's export, TRL's saved model), pictures and blind."""
    from rich.console import Console
    from rich.table import Table

    first = scores["pictures"]["base"]
    t = Table(title=f"Held-out, {first['prompts']} prompts x {first['samples']} samples (Tandem's evaluator on vLLM), "
                    f"after {iterations} iterations; chance {CHANCE:.3f}", header_style="bold")
    for col in ("", "before", "Tandem after", "TRL after", "Tandem - TRL"):
        t.add_column(col, justify="right")
    for name in ("pictures", "blind"):
        r = scores[name]
        for key, label in (("pass_at_1", "pass@1"), ("pass_at_k", f"pass@{r['base']['samples']}")):
            a, b = r["tandem"][key], r["trl"][key]
            t.add_row(f"{label}, {name}", f"{r['base'][key]:.3f}", f"{a:.3f}", f"{b:.3f}", f"{a - b:+.3f}")
    Console(width=120).print(t)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("/tmp/tandem-bench/vlm_vs_trl"))
    ap.add_argument("--iterations", type=int, default=15)
    ap.add_argument("--seed", type=int, default=0, help="spec.seed on Tandem's side, GRPOConfig.seed on TRL's")
    ap.add_argument("--model", type=Path, default=None,
                    help="a LLaVA HF directory (default: `tandem models fetch llava-smollm2`'s, built once)")
    ap.add_argument("--trl-threads", type=int, default=None,
                    help="torch threads for TRL (default: torch's; Tandem's local runner gives each sidecar 1)")
    ap.add_argument("--results", action="store_true", help="also write bench/results/vlm_vs_trl.json")
    args = ap.parse_args(argv)
    if importlib.util.find_spec("trl") is None:
        print(TRL_HINT, file=sys.stderr)
        return 2
    from tandem.sidecars.vlm_demo.__main__ import write

    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    if args.model is None:
        from tandem.cli import pretrained

        src = pretrained.fetch("llava-smollm2", progress=lambda m: print(m, flush=True))
    else:
        src = args.model.resolve()
    files = write(out / "shapes")
    shutil.rmtree(out / "export", ignore_errors=True)
    job, s = tandem_job(out, fresh_copy(src, out / "model-tandem"), files, args.iterations, args.seed)
    tandem = run_tandem(job, out / "tandem-runs")
    trl = run_trl(s, job, fresh_copy(src, out / "model-trl"), out, args.iterations, args.trl_threads, args.seed)
    models = {"base": src, "tandem": out / "export" / f"iteration-{args.iterations}", "trl": Path(trl["saved"])}
    scores = {}
    for name, path in eval_jobs(job, files, out).items():  # after both timed runs, one vLLM at a time
        (out / f"eval-{name}").mkdir(exist_ok=True)
        scores[name] = run_eval(path, models, out / f"eval-{name}")
    result = summarize("vlm", s, args.iterations, trl["parameters"], tandem, trl, out, seed=args.seed)
    held_out_table(scores, args.iterations)
    checks = trl["prompt_check"]
    print("prompt ids, TRL == Tandem (image tokens expanded): " + ", ".join(
        f"row {c['row']} {'equal' if c['ids_equal'] else 'DIFFERENT'} (pixel values max diff "
        f"{c['pixel_values_max_abs_diff']:g})" for c in checks))
    result |= {"model": str(src), "held_out": scores, "chance": CHANCE, "prompt_check": checks,
               "prompt_ids_equal": all(c["ids_equal"] for c in checks)}
    path = out / "vlm_vs_trl.json"
    path.write_text(json.dumps(result, indent=2))
    if args.results:
        (ROOT / "bench" / "results" / "vlm_vs_trl.json").write_text(json.dumps(result, indent=2))
    print(f"result: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
