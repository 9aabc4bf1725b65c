"""TRL's half of the side-by-side benches (bench/rl_vs_trl.py on text, bench/vlm_vs_trl.py on a VLM): Tandem's
rewards as TRL's one reward function, TRL's GRPOConfig for a bench `Size` (rl_vs_trl.py's: the job's settings),
and TRL's train loop timed by phase. Imported by both benches; not run on its own.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any


class TrlRun:
    """What the TRL halves of both benches share: Tandem's rewards as TRL's one
    reward function (per call: completions, mean reward, completion tokens), TRL's GRPOConfig for a `Size`, and
    its train loop timed by phase (sampling; sampling + rewards + log-probs + advantages; the rest)."""

    def __init__(self, reward_set: Any, prompt_text: Any) -> None:
        self.reward_set, self.prompt_text = reward_set, prompt_text
        self.per_call: list[tuple[int, float, int]] = []
        self.t0 = time.perf_counter()  # start-up counts imports, as Tandem's does

    def rewards(self, prompts: list[Any], completions: list[Any], answer: list[Any],
                completion_ids: list[list[int]] | None = None, **_: Any) -> list[float]:
        from tandem.sidecars.rewards import RewardInput

        totals, _parts = self.reward_set.score([
            RewardInput(self.prompt_text(p), c if isinstance(c, str) else c[-1]["content"], a)
            for p, c, a in zip(prompts, completions, answer, strict=True)])
        self.per_call.append((len(totals), sum(totals) / len(totals), sum(map(len, completion_ids or []))))
        return list(totals)

    @staticmethod
    def config(s: Any, out: Path, iterations: int, seed: int, dtype: str = "float32") -> Any:
        from trl import GRPOConfig  # type: ignore[attr-defined]

        completions = s.prompts * s.group
        return GRPOConfig(
            output_dir=str(out / "trl-out"), use_cpu=True, bf16=dtype == "bfloat16", report_to="none",
            save_strategy="no", logging_strategy="steps", logging_steps=1, disable_tqdm=True, seed=seed,
            learning_rate=s.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
            beta=s.kl, epsilon=s.clip, loss_type="dapo",
            gradient_checkpointing=False,  # TRL's default is on; Tandem's activationCheckpointing is off
            scale_rewards="group", num_generations=s.group, max_completion_length=s.max_tokens, temperature=1.0,
            per_device_train_batch_size=s.micro_batch, gradient_accumulation_steps=s.global_batch // s.micro_batch,
            steps_per_generation=completions // s.micro_batch, max_steps=iterations * completions // s.global_batch)

    def train(self, trainer: Any, iterations: int) -> dict[str, Any]:
        """trainer.train(), timed; the figures rl_vs_trl's `summarize` reads (the saved model's path left out)."""
        import torch
        from transformers import TrainerCallback

        clock = {"begin": 0.0, "end": 0.0}

        class Clock(TrainerCallback):  # type: ignore[misc]
            def on_train_begin(self, *a: Any, **k: Any) -> None:
                clock["begin"] = time.perf_counter()

            def on_train_end(self, *a: Any, **k: Any) -> None:
                clock["end"] = time.perf_counter()

        trainer.add_callback(Clock())
        spent = {"_generate_single_turn": 0.0, "_generate_and_score_completions": 0.0}
        for name in spent:  # where TRL's loop goes: sampling, and sampling + rewards + log-probs + advantages
            if hasattr(trainer, name):
                setattr(trainer, name, timed(getattr(trainer, name), spent, name))
        setup = time.perf_counter() - self.t0
        trainer.train()
        wall = time.perf_counter() - self.t0
        loop = clock["end"] - clock["begin"]
        sampled, prepared = spent.values()
        per = self.per_call
        return {"rewards": [m for _, m, _ in per], "completions": sum(n for n, _, _ in per),
                "completion_tokens": sum(n for _, _, n in per), "loop_seconds": loop, "wall_seconds": wall,
                "setup_seconds": setup, "torch_threads": torch.get_num_threads(),
                "phase_seconds_mean": {"generate": sampled / iterations,
                                       "rewards+logprobs": (prepared - sampled) / iterations,
                                       "train": (loop - prepared) / iterations},
                # TRL's own per-step log (entropy, grad_norm, clip ratios), beside Tandem's metrics.jsonl
                "log": [{k: v for k, v in e.items() if isinstance(v, (int, float))}
                        for e in trainer.state.log_history]}


def timed(fn: Any, spent: dict[str, float], name: str) -> Any:
    def wrapper(*a: Any, **k: Any) -> Any:
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            spent[name] += time.perf_counter() - t

    return wrapper
