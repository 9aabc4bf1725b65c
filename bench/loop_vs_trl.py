"""One GRPO optimizer step of Tandem's loop against TRL's GRPOTrainer on the same completions (bench).

Role: the side-by-side benches compare what the two learn over whole runs, where sampling noise is large; this
one holds everything but the update fixed. Both sides start from SmolLM2-135M-Instruct and get the same 16
completions (4 arith prompts x 4, sampled once from the model by transformers, temperature 1, 48 tokens at
most) and the same rewards (Tandem's answerMatch on the decoded text). Tandem runs its real Inference and Train
phases (`trainer.engine` hf or megatron, one optimizer step, token-mean, clip 0.2, no KL); TRL runs
`GRPOTrainer.train()` for one step, the completions handed in through its `rollout_func` and the rewards
through a reward function (loss_type dapo, the same optimizer settings, float32: GRPOConfig's own default is
bf16=True, which put TRL's gradient 4.4% away from the formulas here). Reported per engine:
- the cosine between the two sides' gradients (Adam's first moment after one step is 0.1 x the clipped
  gradient on both sides, so the direction is read from the optimizer state) and the ratio of their norms;
- the relative gap between the two weight updates, |dW_tandem - dW_trl| / |dW_trl|.
The same gradient up to a scale gives cosine 1 (Adam's step does not see the scale: TRL's advantages divide by
std + 1e-4, Tandem's by std + 1e-6). A different weighting of tokens or samples (per sequence instead of per
token, a length-dependent factor) shows as a cosine below 1. Needs TRL in the venv (see rl_vs_trl.TRL_HINT).
    /root/.cache/tandem/venv/bin/python bench/loop_vs_trl.py [--engines hf megatron] [--lr 1e-5]
Writes bench/results/loop_vs_trl.json. Measured 2026-12-07 (2 cores): the hf engine's gradient 2.9e-6 from TRL's
(cosine 1.000000) and its update 9.1e-5; Megatron's update 2.1e-3 from TRL's (2.2e-6 of the weights, ~300 of
135M, moved the other way); TRL and the hf engine each 4e-5 from the plain formulas.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [*(str(ROOT / r) for r in ("operator", "sidecars", "spec", "checkpoint_engine")), str(ROOT / "bench")]

PROMPTS, GROUP, MAX_TOKENS = 4, 4, 48
REWARDS = [{"type": "answerMatch", "match": "flexible"}]


def make_samples(model_dir: Path, seed: int) -> tuple[list[Any], list[dict[str, Any]]]:
    """Tandem Samples (prompt ids, completion ids, group, reward) and the rows they came from."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tandem.sidecars.algorithms.algorithm_interface import Sample
    from tandem.sidecars.rewards import RewardInput, RewardSet
    from tandem.spec.rewards import Reward

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    rows = [json.loads(x) for x in (ROOT / "examples" / "arith" / "train.jsonl").read_text().splitlines()[:PROMPTS]]
    scorer = RewardSet([Reward.model_validate(r) for r in REWARDS])
    torch.manual_seed(seed)
    samples = []
    for g, row in enumerate(rows):
        ids = list(tok.apply_chat_template(row["messages"], add_generation_prompt=True, tokenize=True,
                                           return_dict=True)["input_ids"])
        out = model.generate(torch.tensor([ids] * GROUP), do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                             max_new_tokens=MAX_TOKENS, pad_token_id=tok.pad_token_id)
        for seq in out[:, len(ids):].tolist():
            end = seq.index(tok.eos_token_id) + 1 if tok.eos_token_id in seq else len(seq)
            completion = seq[:end]
            text = tok.decode(completion, skip_special_tokens=True)
            reward = scorer.score([RewardInput(row["messages"][-1]["content"], text, str(row["answer"]))])[0][0]
            samples.append(Sample(ids, completion, group=g, reward=float(reward),
                                  truncated=tok.eos_token_id not in completion))
    return samples, rows


def tandem_step(engine_name: str, model_dir: Path, samples: list[Any], lr: float) -> dict[str, torch.Tensor]:
    """Tandem's Inference and Train phases, one optimizer step: the weights after, and 0.1 x the gradient."""
    from tandem.sidecars.algorithms.algorithm_choice import make_algorithm
    from tandem.sidecars.trainer.loop.context import TrainerContext
    from tandem.sidecars.trainer.loop.phases.inference import inference
    from tandem.sidecars.trainer.loop.phases.train import train
    from tandem.spec.models import RLHFJob

    n = len(samples)
    job = RLHFJob.model_validate({"metadata": {"name": "loop-vs-trl"}, "spec": {
        "model": {"path": str(model_dir)}, "dataset": {"path": "d.jsonl"}, "gpusPerPod": 0, "rewards": REWARDS,
        "algorithm": {"name": "grpo", "klCoef": 0.0, "clip": 0.2, "lr": lr, "groupSize": GROUP},
        "trainer": {"engine": engine_name, "globalBatchSize": n, "microBatchSize": GROUP}}})
    if engine_name == "megatron":
        from tandem.sidecars.trainer.engines.megatron_engine import MegatronEngine

        engine: Any = MegatronEngine.from_hf(model_dir, lr=lr, seed=0, micro_batch_size=GROUP)
    else:
        from tandem.sidecars.trainer.engines.hf_engine import HFEngine

        engine = HFEngine.from_hf(model_dir, lr=lr, seed=0, micro_batch_size=GROUP)
    ctx = TrainerContext(env=None, job=job, engine=engine, reference=None,  # type: ignore[arg-type]
                         algorithm=make_algorithm(job.spec.algorithm), rewards=None, dataset=None,  # type: ignore[arg-type]
                         eos_id=0, pad_id=0)
    inference(ctx, samples, [], scored=([s.reward for s in samples], {}))
    train(ctx, samples)
    weights = {n: t.detach().clone().float() for n, t in engine.export_hf()}
    return weights | {f"grad:{k}": v for k, v in _first_moments(engine).items()}


def plain_gradient(model_dir: Path, samples: list[Any]) -> dict[str, torch.Tensor]:
    """The gradient from the formulas, in plain torch (each sample its own unpadded forward): the group-normalised
    advantage (std + 1e-6) on every completion token, token-mean over the batch; as 0.1 x the gradient clipped to
    norm 1, which is what Adam's first moment holds after one step."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
    groups: dict[int, list[float]] = {}
    for s in samples:
        groups.setdefault(s.group, []).append(s.reward)
    tokens = sum(len(s.completion_ids) for s in samples)
    for s in samples:
        r = torch.tensor(groups[s.group])
        adv = (s.reward - r.mean()) / (r.std() + 1e-6)
        ids = torch.tensor([s.prompt_ids + s.completion_ids])
        logp = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
        p = len(s.prompt_ids)
        taken = logp[torch.arange(p - 1, ids.shape[1] - 1), torch.tensor(s.completion_ids)]
        (-(adv * torch.exp(taken - taken.detach())).sum() / tokens).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    return {f"grad:{n}": 0.1 * p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _first_moments(engine: Any) -> dict[str, torch.Tensor]:
    """Adam's exp_avg per HF weight name where the engine's parameter names map to HF's (hf engine), else {}."""
    opt = getattr(engine, "optimizer", None)
    model = getattr(engine, "model", None)
    if model is None or not isinstance(opt, torch.optim.Optimizer):  # Megatron's optimizer wraps its own
        return {}
    out = {}
    for name, p in model.named_parameters():
        state = opt.state.get(p, {})
        if "exp_avg" in state:
            m = state["exp_avg"]
            out[name] = (m.full_tensor() if hasattr(m, "full_tensor") else m).detach().clone().float()
    return out


def trl_step(model_dir: Path, samples: list[Any], rows: list[dict[str, Any]], lr: float,
             out: Path) -> dict[str, torch.Tensor]:
    """TRL's GRPOTrainer, one optimizer step on `samples` (handed in by rollout_func): the weights after, and
    0.1 x the gradient."""
    import os

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer  # type: ignore[attr-defined]

    by_prompt: dict[str, list[Any]] = {}
    for s in samples:
        by_prompt.setdefault(rows[s.group]["messages"][-1]["content"], []).append(s)
    handed: dict[tuple[str, tuple[int, ...]], float] = {}  # (prompt, completion ids): reward

    def rollout(prompts: list[Any], trainer: Any) -> dict[str, Any]:
        taken: dict[str, int] = {}
        ids, completions = [], []
        for p in prompts:
            key = p[-1]["content"]
            s = by_prompt[key][taken.get(key, 0)]
            taken[key] = taken.get(key, 0) + 1
            ids.append(list(s.prompt_ids))
            completions.append(list(s.completion_ids))
            handed[(key, tuple(s.completion_ids))] = s.reward
        return {"prompt_ids": ids, "completion_ids": completions, "logprobs": [[0.0] * len(c) for c in completions]}

    def reward(prompts: list[Any], completions: list[Any], completion_ids: list[list[int]], **_: Any) -> list[float]:
        return [handed[(p[-1]["content"], tuple(c))] for p, c in zip(prompts, completion_ids, strict=True)]

    n = len(samples)
    config = GRPOConfig(output_dir=str(out / "trl-out"), use_cpu=True, bf16=False, report_to="none", save_strategy="no",
                        disable_tqdm=True, seed=0, learning_rate=lr, lr_scheduler_type="constant", warmup_steps=0,
                        weight_decay=0.0, max_grad_norm=1.0, beta=0.0, epsilon=0.2, loss_type="dapo",
                        scale_rewards="group", num_generations=GROUP, max_completion_length=MAX_TOKENS,
                        temperature=1.0, gradient_checkpointing=False, per_device_train_batch_size=GROUP,
                        gradient_accumulation_steps=n // GROUP, steps_per_generation=n // GROUP, max_steps=1,
                        logging_steps=1)
    data = Dataset.from_list([{"prompt": r["messages"], "answer": str(r["answer"])} for r in rows])
    trainer = GRPOTrainer(model=str(model_dir), reward_funcs=[reward], args=config, train_dataset=data,
                          processing_class=AutoTokenizer.from_pretrained(model_dir), rollout_func=rollout)
    trainer.train()
    if len(handed) != n:
        raise SystemExit(f"TRL's step saw {len(handed)} distinct completions, not {n}")
    weights = {k: v.detach().clone().float() for k, v in trainer.model.state_dict().items()}
    grads = {name: trainer.optimizer.state[p]["exp_avg"].detach().clone().float()
             for name, p in trainer.model.named_parameters() if "exp_avg" in trainer.optimizer.state.get(p, {})}
    return weights | {f"grad:{k}": v for k, v in grads.items()}


def compare(tandem: dict[str, torch.Tensor], trl: dict[str, torch.Tensor],
            start: dict[str, torch.Tensor]) -> dict[str, Any]:
    """The update gap, the share of weights moved the other way, and (where both gradients are known) their
    cosine, relative difference and norm ratio, all in float64."""
    names = [n for n in start if n in tandem and n in trl]
    a = torch.cat([(tandem[n] - start[n]).double().flatten() for n in names])
    b = torch.cat([(trl[n] - start[n]).double().flatten() for n in names])
    out: dict[str, Any] = {"weights_compared": len(names), "update_gap": float((a - b).norm() / b.norm()),
                           "opposite_moves": float(((a * b) < 0).double().mean())}
    grads = [n for n in names if f"grad:{n}" in tandem and f"grad:{n}" in trl]
    if grads:
        g = torch.cat([tandem[f"grad:{n}"].double().flatten() for n in grads])
        h = torch.cat([trl[f"grad:{n}"].double().flatten() for n in grads])
        out |= {"grad_cosine": float(g @ h / (g.norm() * h.norm())), "grad_gap": float((g - h).norm() / h.norm()),
                "grad_norm_ratio": float(g.norm() / h.norm()), "grads_compared": len(grads)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", nargs="+", default=["hf", "megatron"], choices=("hf", "megatron"))
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--seed", type=int, default=0, help="the completions' sampling seed")
    ap.add_argument("--out", type=Path, default=Path("/tmp/tandem-bench/loop_vs_trl"))
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    from rl_vs_trl import prepare

    args.out.mkdir(parents=True, exist_ok=True)
    model_dir, _train, _params = prepare("smollm2", args.out)
    samples, rows = make_samples(model_dir, args.seed)
    from transformers import AutoModelForCausalLM

    start = {k: v.detach().clone() for k, v in AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32).state_dict().items()}
    trl = trl_step(model_dir, samples, rows, args.lr, args.out)
    plain = plain_gradient(model_dir, samples)
    result: dict[str, Any] = {
        "samples": len(samples), "rewards": [s.reward for s in samples],
        "completion_tokens": [len(s.completion_ids) for s in samples],
        "truncated": sum(bool(s.truncated) for s in samples), "lr": args.lr, "engines": {}}
    done = {}
    for name in args.engines:
        done[name] = tandem_step(name, model_dir, samples, args.lr)
        result["engines"][name] = r = compare(done[name], trl, start)
        print(f"{name}: update gap {r['update_gap']:.2e} over {r['weights_compared']} weights, "
              f"a share {r['opposite_moves']:.1e} moved the other way"
              + (f"; gradient cosine {r['grad_cosine']:.6f}, gap {r['grad_gap']:.2e}, norm ratio "
                 f"{r['grad_norm_ratio']:.4f}"
                 if "grad_cosine" in r else ""), flush=True)
    for name, side in (("trl", trl), *done.items()):
        g = [k for k in plain if k in side]  # Megatron's optimizer state is not read (its names are its own)
        if g:
            a = torch.cat([side[k].double().flatten() for k in g])
            b = torch.cat([plain[k].double().flatten() for k in g])
            result[f"{name}_vs_plain"] = r = {"grad_cosine": float(a @ b / (a.norm() * b.norm())),
                                              "grad_gap": float((a - b).norm() / b.norm())}
            print(f"{name} vs the plain formulas: gradient cosine {r['grad_cosine']:.6f}, gap {r['grad_gap']:.2e}")
    if len(done) == 2:  # Tandem's two engines against each other
        result["hf_vs_megatron"] = r = compare(done["megatron"], done["hf"], start)
        print(f"megatron vs hf: update gap {r['update_gap']:.2e}, a share {r['opposite_moves']:.1e} moved the "
              "other way")
    path = ROOT / "bench" / "results" / "loop_vs_trl.json"
    path.write_text(json.dumps(result, indent=2))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
