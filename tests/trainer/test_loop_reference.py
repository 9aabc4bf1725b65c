"""The loop's Inference and Train phases against a plain reference iteration written from the formulas.

Tandem side: the real `inference` and `train` phases on a `TrainerContext` holding a real engine (transformers +
FSDP2 on one rank, or Megatron), the algorithm the job's spec makes, and a reference model of other weights.
Reference side: plain torch and transformers only (no Tandem code): per-sample log-probs of a full forward, the
group-normalised advantages, PPO's GAE and whitening, DPO's pairs, the clipped surrogate, the KL estimators and
the rollout-correction weight, each optimizer step on its share of the samples with AdamW and gradient clipping.
Given the same model, completions, rewards and seeds, the weights after one iteration must be the same, and each
step's ratio and clip figures too, across the job shapes of `CELLS`.

The iteration's loss normaliser (lossAgg) is the whole iteration's: with token-mean every token of the iteration
weighs 1/N, and each of the k optimizer steps takes its share scaled by k (the per-step loss is the sum of its
tokens over N/k), so the steps' gradients at equal weights add up to the full batch's. Optimizer steps split the
packed rows; the samples below are built so that row j holds group j (first-fit-decreasing packs their lengths in
order), which `_premise` checks, and the reference splits the groups in the same contiguous way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from tiny_models import make_tiny_hf_model

from tandem.sidecars.algorithms.algorithm_choice import make_algorithm
from tandem.sidecars.algorithms.algorithm_interface import Sample
from tandem.sidecars.trainer.engines.hf_engine import HFEngine
from tandem.sidecars.trainer.loop.context import TrainerContext
from tandem.sidecars.trainer.loop.forwards.reference import ReferenceWeights
from tandem.sidecars.trainer.loop.phases.inference import inference
from tandem.sidecars.trainer.loop.phases.train import train
from tandem.spec.models import RLHFJob

# Adam moves every weight by about LR a step: at 3e-3 the fourth step has clipped a third of the tokens and one
# of them sits so near the bound that summation order decides its side; at 1e-3 the clip still bites (12-16%)
LR = 1e-3
# (prompt tokens, completion tokens) per group of 4: totals 16 > 15 > 14 > 13 and shared units 52 > 45 > 38 > 37,
# so first-fit-decreasing into 64-token rows keeps group j in row j with or without shared prompts
SHAPES = [(4, 12), (5, 10), (6, 8), (5, 8)]
REWARDS = [[1.0, 0.0, 0.0, 1.0], [0.0, 1.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0], [0.5, 1.0, 0.0, 0.0]]


@dataclass(frozen=True)
class Cell:
    name: str
    algorithm: dict[str, Any]
    batch: int = 16  # trainer.globalBatchSize: 16 = one step, 4 = four
    micro: int = 4  # trainer.microBatchSize (rows per micro-batch of a step)
    share: bool = False
    engine: str = "hf"
    tp: int = 1  # Megatron's tensor and pipeline parallel sizes
    pp: int = 1
    lora: dict[str, Any] | None = None  # trainer.lora (the hf engine)
    world: int = 1  # trainer ranks (spawned gloo processes when > 1); the data-parallel size is world / (tp pp)
    marks: tuple[Any, ...] = field(default_factory=tuple)


GRPO = {"name": "grpo", "klCoef": 0.0, "clip": 0.2}
CELLS = [
    Cell("grpo-1step", GRPO),
    Cell("grpo-1step-micro1", GRPO, micro=1),  # gradient accumulation over 4 micro-batches
    Cell("grpo-4steps", GRPO, batch=4),
    Cell("grpo-4steps-2epochs", {**GRPO, "epochs": 2}, batch=4),
    Cell("grpo-1step-2epochs", {**GRPO, "epochs": 2}),
    Cell("grpo-4steps-shared", GRPO, batch=4, share=True),
    Cell("grpo-1step-shared-micro1", GRPO, micro=1, share=True),
    Cell("grpo-4steps-tis", {**GRPO, "tisCap": 1.5}, batch=4),
    Cell("grpo-4steps-kl-loss", {**GRPO, "klCoef": 0.05, "klPenalty": "loss", "klEstimator": "k3"}, batch=4),
    Cell("grpo-4steps-kl-reward", {**GRPO, "klCoef": 0.05, "klPenalty": "reward", "klEstimator": "k1"}, batch=4),
    Cell("grpo-4steps-seqmean", {**GRPO, "lossAgg": "seq-mean-token-mean"}, batch=4),
    Cell("grpo-4steps-trainer-old", {**GRPO, "oldLogprobs": "trainer"}, batch=4),
    Cell("grpo-4steps-rollout-old", {**GRPO, "oldLogprobs": "rollout"}, batch=4),
    Cell("ppo-4steps", {"name": "ppo", "klCoef": 0.05, "clip": 0.2}, batch=4),
    Cell("dpo-1step", {"name": "dpo", "beta": 0.1}),
    Cell("dpo-2steps", {"name": "dpo", "beta": 0.1}, batch=8),
    Cell("grpo-4steps-lora", GRPO, batch=4, lora={"rank": 4, "alpha": 8, "targetModules": ["q_proj", "v_proj"]}),
    Cell("kto-1step", {"name": "kto", "beta": 0.1, "desirableWeight": 1.3}),
    Cell("kto-4steps", {"name": "kto", "beta": 0.1, "desirableWeight": 1.3}, batch=4),
    Cell("grpo-4steps-megatron", GRPO, batch=4, engine="megatron", marks=(pytest.mark.megatron,)),
    Cell("grpo-4steps-megatron-shared", GRPO, batch=4, share=True, engine="megatron", marks=(pytest.mark.megatron,)),
    Cell("grpo-1step-megatron-shared-micro1", GRPO, micro=1, share=True, engine="megatron",
         marks=(pytest.mark.megatron,)),
    Cell("grpo-2steps-dp2", GRPO, batch=8, micro=1, world=2),  # each step's two rows, one per FSDP2 rank
    Cell("grpo-4steps-megatron-tp2", GRPO, batch=4, engine="megatron", tp=2, world=2, marks=(pytest.mark.megatron,)),
    Cell("grpo-4steps-megatron-pp2", GRPO, batch=4, micro=1, engine="megatron", pp=2, world=2,
         marks=(pytest.mark.megatron,)),
]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("loop-reference")
    return make_tiny_hf_model(root / "policy", seed=0), make_tiny_hf_model(root / "ref", seed=1)


def make_samples(policy: Path) -> list[Sample]:
    """Four groups of four completions (`SHAPES`, `REWARDS`); rollout log-probs: the policy's own, perturbed as
    another engine's would be (up to +-0.3 per token)."""
    gen = torch.Generator().manual_seed(7)
    model = _load(policy)
    out: list[Sample] = []
    for g, (p, c) in enumerate(SHAPES):
        prompt = torch.randint(1, 128, (p,), generator=gen).tolist()
        for _ in range(4):
            s = Sample(prompt, torch.randint(1, 128, (c,), generator=gen).tolist(), group=g)
            with torch.no_grad():
                exact = _logprobs(model, s)
            s.rollout_logprobs = (exact + 0.3 * (2 * torch.rand(c, generator=gen) - 1)).tolist()
            out.append(s)
    return out


# ---- the reference: plain torch and transformers, from the formulas ----------------------------------------

def _load(path: Path) -> Any:
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")


def _logprobs(model: Any, s: Sample) -> torch.Tensor:
    """log pi(y_t | x, y_<t) of each completion token, from one forward of prompt + completion."""
    ids = torch.tensor([s.prompt_ids + s.completion_ids])
    logp = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
    p = len(s.prompt_ids)
    return logp[torch.arange(p - 1, ids.shape[1] - 1), torch.tensor(s.completion_ids)]


def _kl(kind: str, logp: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    d = logp - ref
    return {"k1": d, "k2": 0.5 * d * d, "k3": torch.exp(-d) + d - 1.0}[kind]


def _group_advantages(rewards: list[float]) -> list[float]:
    r = torch.tensor(rewards)
    out = torch.zeros(len(rewards))
    for g in range(len(SHAPES)):
        x = r[4 * g:4 * g + 4]
        out[4 * g:4 * g + 4] = (x - x.mean()) / (x.std() + 1e-6)
    return out.tolist()


def _ppo_advantages(samples: list[Sample], old: list[torch.Tensor], ref: list[torch.Tensor], coef: float,
                    lam: float = 0.95) -> list[torch.Tensor]:
    """Token rewards -coef (old - ref) with the score on the last token, values the group's mean score, GAE
    (gamma 1), then whitened over every token of the batch (population variance)."""
    adv = []
    for i, s in enumerate(samples):
        r = -coef * (old[i] - ref[i])
        r[-1] += s.reward
        v = sum(x.reward for x in samples if x.group == s.group) / 4
        a, running, next_v = torch.zeros(len(r)), 0.0, 0.0
        for t in reversed(range(len(r))):
            running = float(r[t]) + next_v - v + lam * running
            a[t], next_v = running, v
        adv.append(a)
    flat = torch.cat(adv)
    mean, var = flat.mean(), flat.var(unbiased=False)
    return [(a - mean) / torch.sqrt(var + 1e-8) for a in adv]


def _with_adapters(model: Any, lora: dict[str, Any], start: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """Each target linear layer computes x W^T + b + alpha / rank x (x A^T) B^T, from the adapters `start`
    (module name + ".A" / ".B"); the base weights frozen. Returns the adapters (the trained parameters)."""
    scale = lora["alpha"] / lora["rank"]
    for p in model.parameters():
        p.requires_grad_(False)
    trained: list[torch.Tensor] = []
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] not in lora["targetModules"]:
            continue
        a = start[f"{name}.A"].clone().requires_grad_(True)
        b = start[f"{name}.B"].clone().requires_grad_(True)
        module.lora = (a, b)

        def forward(x: torch.Tensor, m: Any = module) -> torch.Tensor:
            a, b = m.lora
            return torch.nn.functional.linear(x, m.weight, m.bias) + scale * ((x @ a.t()) @ b.t())

        module.forward = forward
        trained += [a, b]
    return trained


def _merged(model: Any, lora: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The weights with each adapter merged in: W + alpha / rank x B A."""
    out = {n: p.detach().clone() for n, p in model.named_parameters()}
    for name, module in model.named_modules():
        if hasattr(module, "lora"):
            a, b = module.lora
            out[f"{name}.weight"] += lora["alpha"] / lora["rank"] * (b @ a).detach()
    return out


def reference_iteration(cell: Cell, policy: Path, ref_dir: Path, samples: list[Sample],
                        adapters: dict[str, torch.Tensor] | None = None) -> dict[str, Any]:
    algo = {"epochs": 1, "oldLogprobs": "auto", "klPenalty": "loss", "lossAgg": "token-mean", **cell.algorithm}
    model, ref_model = _load(policy), _load(ref_dir)
    trained = list(model.parameters()) if cell.lora is None else _with_adapters(model, cell.lora, adapters or {})
    opt = torch.optim.AdamW(trained, lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    with torch.no_grad():
        old = [_logprobs(model, s) for s in samples]  # the policy that sampled: these weights
        ref = [_logprobs(ref_model, s) for s in samples]
    rollout = [torch.tensor(s.rollout_logprobs or []) for s in samples]
    if algo["oldLogprobs"] == "rollout":
        old = rollout
    coef, clip = float(algo.get("klCoef", 0.0)), float(algo.get("clip", 0.2))
    rewards = [s.reward for s in samples]
    if algo["name"] == "kto":  # examples labelled desirable when rewarded; the probes follow them
        examples = [i for i, s in enumerate(samples) if not s.kl_probe]
        probes = [i for i, s in enumerate(samples) if s.kl_probe]
        z0 = max(0.0, sum(float(old[i].sum() - ref[i].sum()) for i in probes) / len(probes))
        rows = [examples[4 * g:4 * g + 4] for g in range(len(SHAPES))]
    elif algo["name"] == "dpo":
        units = [[4 * g + max(range(4), key=lambda k: (REWARDS[g][k], -k)),
                  4 * g + min(range(4), key=lambda k: (REWARDS[g][k], k))] for g in range(len(SHAPES))]
        rows = [units[0] + units[1], units[2] + units[3]]  # two 64-token rows: pairs (32 + 30), (28 + 26)
    else:
        rows = [list(range(4 * g, 4 * g + 4)) for g in range(len(SHAPES))]
        if algo["name"] == "grpo":
            if coef > 0 and algo["klPenalty"] == "reward":
                rewards = [r - coef * float(_kl(algo["klEstimator"], o, f).sum())
                           for r, o, f in zip(rewards, old, ref, strict=True)]
            adv = [torch.full((len(s.completion_ids),), a) for s, a in zip(samples, _group_advantages(rewards),
                                                                            strict=True)]
        else:
            adv = _ppo_advantages(samples, old, ref, coef)
    examples_trained = sum(not s.kl_probe for s in samples)  # kto's probes only set z0
    steps = min(math.ceil(examples_trained / cell.batch), len(rows))
    bounds = [round(i * len(rows) / steps) for i in range(steps + 1)]
    parts = [sum(rows[bounds[i]:bounds[i + 1]], []) for i in range(steps)]
    tokens = sum(len(s.completion_ids) for s in samples if not s.kl_probe)
    per_step = []
    for _ in range(algo["epochs"]):
        for part in parts:
            opt.zero_grad()
            total = torch.zeros(())
            ratios, clipped = [], []
            if algo["name"] == "kto":
                lam_d = algo.get("desirableWeight", 1.0)
                for i in part:
                    r = _logprobs(model, samples[i]).sum() - ref[i].sum()
                    b = algo["beta"]
                    per = lam_d * (1 - torch.sigmoid(b * (r - z0))) if samples[i].desirable else \
                        1 - torch.sigmoid(b * (z0 - r))
                    total = total + per * steps / len(examples)
            if algo["name"] == "dpo":
                pairs = [part[j:j + 2] for j in range(0, len(part), 2)]
                for c, r in pairs:
                    margin = (_logprobs(model, samples[c]).sum() - ref[c].sum()) - \
                             (_logprobs(model, samples[r]).sum() - ref[r].sum())
                    total = total - torch.nn.functional.logsigmoid(algo["beta"] * margin) * steps / len(units)
            for i in part if algo["name"] in ("grpo", "ppo") else []:
                logp = _logprobs(model, samples[i])
                ratio = torch.exp(logp - old[i])
                a = adv[i]
                per_tok = -torch.minimum(ratio * a, torch.clamp(ratio, 1 - clip, 1 + clip) * a)
                if "tisCap" in algo:
                    per_tok = per_tok * torch.clamp(torch.exp(old[i] - rollout[i]), max=algo["tisCap"])
                if algo["name"] == "grpo" and coef > 0 and algo["klPenalty"] == "loss":
                    per_tok = per_tok + coef * _kl(algo["klEstimator"], logp, ref[i])
                if algo["lossAgg"] == "token-mean":
                    total = total + per_tok.sum() * steps / tokens
                else:  # seq-mean-token-mean
                    total = total + per_tok.mean() * steps / len(samples)
                ratios.append(ratio.detach())
                r = ratio.detach()
                clipped.append(torch.clamp(r, 1 - clip, 1 + clip) * a < r * a)  # the clipped term was the min
            total.backward()
            torch.nn.utils.clip_grad_norm_(trained, 1.0)
            opt.step()
            if ratios:
                per_step.append({"ratio_mean": float(torch.cat(ratios).mean()),
                                 "clip_frac": float(torch.cat(clipped).float().mean())})
    weights = _merged(model, cell.lora) if cell.lora is not None else \
        {n: p.detach().clone() for n, p in model.named_parameters()}
    return {"weights": weights, "steps": per_step}


# ---- Tandem: the real phases ------------------------------------------------------------------------------

def tandem_iteration(cell: Cell, policy: Path, ref_dir: Path, samples: list[Sample]) -> dict[str, Any]:
    job = RLHFJob.model_validate({"metadata": {"name": "ref"}, "spec": {
        "model": {"path": str(policy)}, "reference": {"path": str(ref_dir)}, "dataset": {"path": "d.jsonl"},
        "gpusPerPod": 0, "rewards": [{"type": "answerMatch"}],
        "algorithm": {**cell.algorithm, "lr": LR, "groupSize": 4},
        **({"dataset": {"path": "d.jsonl", "completionField": "completion", "labelField": "label"}}
           if cell.algorithm["name"] == "kto" else {}),
        "trainer": {"engine": cell.engine, "globalBatchSize": cell.batch, "microBatchSize": min(cell.micro, cell.batch),
                    "sharePrompts": cell.share, **({"lora": cell.lora} if cell.lora else {})}}})
    if cell.engine == "megatron":
        from tandem.sidecars.trainer.engines.megatron_engine import MegatronEngine

        engine: Any = MegatronEngine.from_hf(policy, lr=LR, seed=0, micro_batch_size=cell.micro,
                                             tensor_parallel=cell.tp, pipeline_parallel=cell.pp)
    else:
        engine = HFEngine.from_hf(policy, lr=LR, seed=0, micro_batch_size=cell.micro, lora=job.spec.trainer.lora)
    adapters = _adapters(engine) if cell.lora is not None else None
    algorithm = make_algorithm(job.spec.algorithm, share_prompts=cell.share)
    reference = ReferenceWeights.capture(engine, str(ref_dir)) if algorithm.needs_reference or \
        job.spec.algorithm.kl_coef > 0 else None
    ctx = TrainerContext(env=None, job=job, engine=engine, reference=reference,  # type: ignore[arg-type]
                         algorithm=algorithm, rewards=None, dataset=None, eos_id=0, pad_id=0)  # type: ignore[arg-type]
    rewards = [s.reward for s in samples]
    inference(ctx, samples, [], scored=(rewards, {}))
    out = train(ctx, samples)
    return {"weights": {n: t.detach().clone() for n, t in engine.export_hf()}, "metrics": out, "adapters": adapters}


def _adapters(engine: Any) -> dict[str, torch.Tensor]:
    """The engine's adapters before training, by module name + ".A" / ".B" (PEFT's initial values: the
    reference starts from the same model)."""
    out = {}
    for name, p in engine.model.named_parameters():
        for kind in ("A", "B"):
            mark = f".lora_{kind}.default.weight"
            if name.endswith(mark):
                full = p.full_tensor() if hasattr(p, "full_tensor") else p
                out[name.removeprefix("base_model.model.").removesuffix(mark) + f".{kind}"] = full.detach().clone()
    return out


def _spawned(cell: Cell, policy: Path, ref_dir: Path, samples: list[Sample], out: Path) -> dict[str, Any]:
    """`tandem_iteration` on `cell.world` spawned gloo ranks; what rank 0 saw (its export holds every weight)."""
    import torch.multiprocessing as mp

    from tandem.checkpoint_engine.etcd.local_etcd import free_port

    torch.save(samples, out / "samples.pt")
    mp.start_processes(_rank, args=(cell.world, free_port(), str(out), cell.name, str(policy), str(ref_dir)),
                       nprocs=cell.world, start_method="spawn")
    got: dict[str, Any] = torch.load(out / "rank0.pt", weights_only=False)
    return got


def _rank(rank: int, world: int, port: int, out: str, name: str, policy: str, ref_dir: str) -> None:
    from dist_worker import join

    join(rank, world, port)
    cell = next(c for c in CELLS if c.name == name)
    samples = torch.load(Path(out) / "samples.pt", weights_only=False)
    torch.save(tandem_iteration(cell, Path(policy), Path(ref_dir), samples), Path(out) / f"rank{rank}.pt")
    torch.distributed.barrier()  # no rank leaves while another still talks to it (gloo aborts a lone peer)
    torch.distributed.destroy_process_group()


def _premise(cell: Cell, policy: Path, samples: list[Sample]) -> None:
    """The packed rows are the groups in order (the split of optimizer steps the reference assumes)."""
    from tandem.sidecars.algorithms.algorithm_interface import pack_samples, row_budget

    batch = pack_samples(samples, row_budget(samples, share_prompts=cell.share, hidden=64), share_prompts=cell.share)
    assert [sorted(p.sample for p in batch.placements if p.row == r) for r in range(batch.num_rows)] == \
        [list(range(4 * g, 4 * g + 4)) for g in range(len(SHAPES))]


def _relative_gap(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], start: dict[str, torch.Tensor]) -> float:
    """|update_got - update_want| / |update_want| over every weight (the update: after - before)."""
    num = sum(float(((got[n] - start[n]) - (want[n] - start[n])).pow(2).sum()) for n in want)
    den = sum(float((want[n] - start[n]).pow(2).sum()) for n in want)
    return math.sqrt(num / den)


def _samples(policy: Path, algorithm: str = "grpo") -> list[Sample]:
    """The groups with their rewards; for kto, labelled (desirable when rewarded above 0.5, no reward) and
    followed by the KL probes: prompt i with the completion of example (i + 1) mod n."""
    samples = make_samples(policy)
    for s, r in zip(samples, [r for g in REWARDS for r in g], strict=True):
        s.reward = r
    if algorithm != "kto":
        return samples
    for s in samples:
        s.desirable, s.reward = s.reward > 0.5, 0.0
    n = len(samples)
    return samples + [Sample(list(s.prompt_ids), list(samples[(i + 1) % n].completion_ids), group=s.group,
                             kl_probe=True, rollout_logprobs=None) for i, s in enumerate(samples)]


@pytest.mark.parametrize("cell", [pytest.param(c, id=c.name, marks=c.marks) for c in CELLS])
def test_one_iteration_equals_the_plain_reference(cell: Cell, dirs: tuple[Path, Path], tmp_path: Path) -> None:
    policy, ref_dir = dirs
    samples = _samples(policy, cell.algorithm["name"])
    _premise(cell, policy, [s for s in samples if not s.kl_probe])
    start = {n: p.detach().clone() for n, p in _load(policy).named_parameters()}
    copies = [Sample(**vars(s)) for s in samples]
    got = tandem_iteration(cell, policy, ref_dir, copies) if cell.world == 1 else \
        _spawned(cell, policy, ref_dir, copies, tmp_path)
    if cell.lora is not None:  # PEFT's initial adapters: every target layer's A random, B zero
        assert len(got["adapters"]) == 2 * 2 * 2 and all(float(t.abs().sum()) == 0.0
                                                       for n, t in got["adapters"].items() if n.endswith(".B"))
    want = reference_iteration(cell, policy, ref_dir, [Sample(**vars(s)) for s in samples], got["adapters"])
    tied = [n for n in want["weights"] if n not in got["weights"]]
    assert tied in ([], ["lm_head.weight"])  # a tied head is exported once, as HF saves it
    want_w = {n: t for n, t in want["weights"].items() if n not in tied}
    gap = _relative_gap(got["weights"], want_w, start)
    assert gap < 2e-3, (cell.name, gap)
    updates = len(want["steps"]) or None
    if updates is not None:
        assert got["metrics"]["optimizer_steps"] == updates
        for k, (g, w) in enumerate(zip(got["metrics"]["steps"], want["steps"], strict=True)):
            assert g["ratio_mean"] == pytest.approx(w["ratio_mean"], abs=2e-4), (k, g, w)
            if cell.micro >= 4 or cell.batch == 4:  # one micro-batch per step: its mean is the step's
                assert g["clip_frac"] == pytest.approx(w["clip_frac"], abs=1e-6), (k, g, w)
    if updates is not None and updates > 1 and cell.algorithm.get("oldLogprobs") != "rollout":
        # the later steps are measured against the sampling policy: the ratio leaves 1 and the clip bites
        assert got["metrics"]["steps"][0]["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
        assert max(abs(s["ratio_mean"] - 1.0) for s in got["metrics"]["steps"][1:]) > 1e-3
        if max(s["clip_frac"] for s in want["steps"]) > 0:  # two steps of lr 1e-3 may stay inside the clip
            assert max(s["clip_frac"] for s in got["metrics"]["steps"]) > 0.0


def test_the_reference_tells_a_missing_trust_region_apart(dirs: tuple[Path, Path]) -> None:
    """The comparison can fail: the same four-step iteration with each step's ratio taken against its own
    weights (the old log-probs left out) lands measurably away from the reference."""
    policy, ref_dir = dirs
    cell = next(c for c in CELLS if c.name == "grpo-4steps")
    samples = _samples(policy)
    start = {n: p.detach().clone() for n, p in _load(policy).named_parameters()}
    want = reference_iteration(cell, policy, ref_dir, [Sample(**vars(s)) for s in samples])
    no_trust = reference_iteration(cell, policy, ref_dir, [Sample(**vars(s)) for s in samples])
    assert _relative_gap(no_trust["weights"], want["weights"], start) == 0.0  # the reference is deterministic
    import tandem.sidecars.trainer.loop.phases.inference as phase

    original = phase.needs_old_logprobs
    phase.needs_old_logprobs = lambda ctx, samples: False  # type: ignore[assignment]
    try:
        got = tandem_iteration(cell, policy, ref_dir, [Sample(**vars(s)) for s in samples])
    finally:
        phase.needs_old_logprobs = original
    want_w = {n: t for n, t in want["weights"].items() if n in got["weights"]}
    assert _relative_gap(got["weights"], want_w, start) > 2e-2
    assert all(s["ratio_mean"] == pytest.approx(1.0, abs=1e-5) for s in got["metrics"]["steps"])
    assert all(s["clip_frac"] == 0.0 for s in got["metrics"]["steps"])
