"""The demo's tiny task and model, built locally: arithmetic prompts, a trained tokenizer, a tiny
Qwen2 with a short supervised warm-up.

Callers: `tandem run` examples (`build_toy(out_dir)` then `model.path` = `paths.model_dir`,
`dataset.path` = `paths.train_path`, `rewards` = `reward_specs()`), tests, benchmarks.
CLI: `python -m tandem.sidecars.toy OUT_DIR [--seed N] [--warmup-steps N]`.
"""

from tandem.sidecars.toy import build, model, task, tokenizer
from tandem.sidecars.toy.build import ToyParams, ToyPaths, build_toy, load_problems
from tandem.sidecars.toy.task import FORMAT_PATTERN, make_problems, reward_specs, target_completion

__all__ = [
    "FORMAT_PATTERN", "ToyParams", "ToyPaths", "build", "build_toy", "load_problems",
    "make_problems", "model", "reward_specs", "target_completion", "task", "tokenizer",
]
