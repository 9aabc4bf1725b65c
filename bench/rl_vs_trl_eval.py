"""Held-out evaluation of HuggingFace model directories with Tandem's own evaluation code (bench helper).

Role: `bench/rl_vs_trl.py --size smollm2` scores models that were not trained by a running Tandem
job — TRL's trained model, the untrained base model (TRL's "before") and, as a cross-check, the
HF directory Tandem exported after its last iteration — along the same code path as Tandem's
in-loop `spec.eval`: the job file's eval dataset rendered by `PromptDataset.load` with the job
model's tokenizer (chat template, token ids), `Evaluator.run` (pass@1 / pass@k, the job's verifiable
rewards at full weight, the eval's temperature, samples and max tokens), generating on a
`RolloutEngine` (vLLM, float32 on CPU, the rollout sidecar's max_model_len) started on the
directory itself (`dummy=False`) instead of on shared-memory versions. One vLLM at a time; each is
terminated before the next starts.
Run by the bench as a subprocess (vLLM's environment and worker processes stay out of the process
that ran TRL):
    python bench/rl_vs_trl_eval.py JOB.yaml NAME=MODEL_DIR [NAME=MODEL_DIR ...] --out RESULT.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / r) for r in ("operator", "sidecars", "spec", "checkpoint_engine")]


class EngineGenerator:
    """`evaluate.Generator` over a local RolloutEngine: every completion comes from the one loaded model."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def generate(self, prompts: Sequence[Any], options: Any, n: int,
                 images: Sequence[Sequence[Any]] | None = None) -> tuple[list[list[Any]], set[int | None]]:
        return self.engine.generate(prompts, options, n=n, images=images), {None}


def evaluate(job_file: Path, models: dict[str, Path], seed: int = 0, draws: int = 1) -> dict[str, dict[str, Any]]:
    """Each model's pass@1 / pass@k over `draws` evaluations in a row on one vLLM started with `seed` (each draw
    continues the engine's random stream; on CPU a request's own seed is dropped, so the engine's is all there
    is): models scored with one seed share their draws, and a run's seed gives other draws than another's."""
    from transformers import AutoTokenizer

    from tandem.sidecars.rollout_engine.engine import EngineConfig, RolloutEngine
    from tandem.sidecars.trainer.loop.data.dataset import PromptDataset
    from tandem.sidecars.trainer.loop.held_out import Evaluator
    from tandem.spec import model_dir
    from tandem.spec.load import load_job

    spec = load_job(job_file).spec
    if spec.eval is None:
        raise SystemExit(f"{job_file}: no spec.eval to evaluate with")
    tok = AutoTokenizer.from_pretrained(spec.model.path)  # what Tandem's trainer renders prompts with
    evaluator = Evaluator(spec.eval, PromptDataset.load(spec.eval.dataset, tok).head(spec.eval.prompts),
                          spec.rewards, max_tokens=spec.rollout.max_tokens, iterations=spec.algorithm.iterations)
    out: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="rl-vs-trl-eval-") as shm:
        for name, model in models.items():
            t = time.perf_counter()
            engine = RolloutEngine(EngineConfig(shm_root=Path(shm), job="bench-eval", seed=seed,
                                                max_model_len=model_dir.context_length(
                                                    spec.rollout, model_dir.read_config(model, name))))
            engine.start(str(model), dummy=False)
            try:
                rows, answers = [], []
                for _ in range(draws):
                    rows.append(evaluator.run(EngineGenerator(engine), 0, 0).row())
                    answers += evaluator.samples
            finally:
                engine.terminate()
            mean = {k: sum(r[k] for r in rows) / draws for k in ("pass_at_1", "pass_at_k", "reward_mean")}
            out[name] = {**rows[0], **mean, "seconds": sum(r["seconds"] for r in rows), "model": str(model),
                         "seed": seed, "draws": [r["pass_at_1"] for r in rows], "answers": answers,
                         "with_start_seconds": time.perf_counter() - t}
            print(f"{name}: pass@1 {mean['pass_at_1']:.3f} pass@{rows[0]['samples']} {mean['pass_at_k']:.3f} "
                  f"(seed {seed}, draws {[round(r['pass_at_1'], 3) for r in rows]}; {out[name]['seconds']:.1f} s, "
                  f"{out[name]['with_start_seconds']:.1f} s with vLLM start)", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("job", type=Path)
    ap.add_argument("models", nargs="+", help="NAME=MODEL_DIR")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=0, help="the vLLM engine's seed (its random stream)")
    ap.add_argument("--draws", type=int, default=1, help="evaluations per model, averaged")
    args = ap.parse_args(argv)
    models = {name: Path(path) for name, _, path in (m.partition("=") for m in args.models)}
    args.out.write_text(json.dumps(evaluate(args.job, models, args.seed, args.draws), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
