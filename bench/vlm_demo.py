"""The VLM demo measured: held-out pass@1 before and after GRPO, with the pictures and without them.

Role: `make vlm-demo`'s job (examples/vlm-grpo.yaml) on the LLaVA built from SmolLM2 (`tandem models fetch
llava-smollm2`), run by `tandem run` with an export of its last iteration, then the base model and that export
evaluated by Tandem's own evaluation code (bench/rl_vs_trl_eval.py: the job's eval settings, vLLM on the model
directory) on the held-out pictures (test.jsonl) and on the same questions with the picture taken out
(test-blind.jsonl): the gain is the model looking at the picture when the blind score stays near chance (1/6).
Prints one table and writes bench/results/vlm_demo.json (with the run's wall time, seconds per iteration, peak
memory, the in-loop eval curve, and the share of answers naming more than one colour: a policy listing colours
games a reward that finds the answer anywhere; the curve's plot is the run's progress.png; the answers themselves
in the --out folder).
    python bench/vlm_demo.py [--out /tmp/tandem-bench/vlm_demo] [--iterations 15]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / r) for r in ("operator", "sidecars", "spec", "checkpoint_engine")]
CHANCE = 1 / 6


def job_for(out: Path, model: Path, files: dict[str, Path], iterations: int) -> dict[str, Any]:
    job: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "vlm-grpo.yaml").read_text())
    spec = job["spec"]
    spec["model"]["path"] = str(model)
    spec["dataset"]["path"] = str(files["train"])
    spec["eval"]["dataset"]["path"] = str(files["test"])
    spec["algorithm"]["iterations"] = iterations
    spec["volumes"] = [{"name": "bench", "mountPath": "/bench", "hostPath": str(out)}]
    spec["export"] = {"path": "/bench/export", "every": iterations}
    return job


def several_colours(text: str) -> bool:
    """An answer naming more than one of the task's colours: what a policy that lists them writes (a reward that
    finds the answer anywhere in the text pays for it; answerMatch strict does not)."""
    from tandem.sidecars.vlm_demo.shapes import COLOURS

    return len({w for w in re.findall(r"[a-z]+", text.lower()) if w in COLOURS}) > 1


def main(argv: list[str] | None = None) -> int:
    from rl_vs_trl_eval import evaluate
    from tandem.cli import pretrained
    from tandem.sidecars.vlm_demo.__main__ import write

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("/tmp/tandem-bench/vlm_demo"))
    ap.add_argument("--iterations", type=int, default=15)
    args = ap.parse_args(argv)
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    model = pretrained.fetch("llava-smollm2", progress=lambda m: print(m, flush=True))
    files = write(out / "shapes")
    job = job_for(out, model, files, args.iterations)
    (out / "job.yaml").write_text(yaml.safe_dump(job))
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "tandem.cli.main", "run", str(out / "job.yaml"), "--workdir",
                    str(out / "runs")], check=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path[:4])})
    wall = time.perf_counter() - t
    rows = [json.loads(x) for x in (out / "runs" / "vlm-grpo" / "metrics.jsonl").read_text().splitlines()]
    export = out / "export" / f"iteration-{args.iterations}"
    result: dict[str, Any] = {"iterations": args.iterations, "wall_seconds": wall,
                              "seconds_per_iteration": [r["total_seconds"] for r in rows],
                              "peak_rss_mib": max(r.get("memory", {}).get("peak_rss_mib", 0.0) for r in rows),
                              "eval_curve": [(r["iteration"], r["eval"]["pass_at_1"]) for r in rows if "eval" in r],
                              "mismatch_kl": [r.get("mismatch_kl") for r in rows],
                              "reward": [r["reward_mean"] for r in rows]}
    for name, data in (("pictures", files["test"]), ("blind", files["blind"])):
        scored = dict(job, spec={**job["spec"], "eval": {**job["spec"]["eval"], "dataset": {
            "path": str(data), "promptField": "messages"}}})
        (out / f"eval-{name}.yaml").write_text(yaml.safe_dump(scored))
        scores = evaluate(out / f"eval-{name}.yaml", {"before": model, "after": export})
        for when, score in scores.items():  # the answers to a file of their own; here, how many list colours
            answers = score.pop("answers")
            (out / f"answers-{name}-{when}.json").write_text(json.dumps(answers))
            score["several_colours"] = sum(several_colours(a["text"]) for a in answers) / max(len(answers), 1)
        result[name] = scores
    (ROOT / "bench" / "results" / "vlm_demo.json").write_text(json.dumps(result, indent=2))
    print(f"\nVLM demo, {args.iterations} iterations, {wall / 60:.1f} min ({out})")
    print(f"{'held-out pass@1':24s} {'before':>8s} {'after':>8s}")
    for name in ("pictures", "blind"):
        r = result[name]
        print(f"{name:24s} {r['before']['pass_at_1']:8.3f} {r['after']['pass_at_1']:8.3f}   answers naming several "
              f"colours {r['before']['several_colours']:.3f} -> {r['after']['several_colours']:.3f}")
    print(f"chance {CHANCE:.3f}; peak RSS {result['peak_rss_mib']:.0f} MiB; curve {result['eval_curve']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
