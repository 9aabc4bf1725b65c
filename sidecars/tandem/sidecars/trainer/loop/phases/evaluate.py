"""The Eval phase: held-out evaluation on the live rollouts when `spec.eval` says it is due.

Role: at the start (before any training), every `eval.every` iterations and at the end, the driver reports
phase `eval`, runs the job's `held_out.Evaluator` (pass@1, pass@k) on the version the rollouts serve, and
writes the result to Prometheus, the tracker and, when TANDEM_OUTPUT_DIR is set, eval.jsonl (and every answer,
its length, finish reason and verdict, to eval-samples.jsonl); the next
progress records carry it. Driver rank only. Caller: `driver.run`.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING

from tandem.sidecars.trainer.loop.phases.report import report

if TYPE_CHECKING:
    from tandem.sidecars.trainer.loop.context import TrainerContext
    from tandem.sidecars.trainer.loop.held_out import EvalResult

log = logging.getLogger(__name__)


def evaluate(ctx: TrainerContext, iterations_done: int, version: int) -> EvalResult | None:
    """spec.eval, when due after `iterations_done` iterations: pass@1/pass@k on the live rollouts."""
    if ctx.evaluator is None or ctx.rollouts is None or not ctx.evaluator.due(iterations_done):
        return None
    report(ctx, "eval", iterations_done, version)
    result = ctx.evaluator.run(ctx.rollouts, iterations_done, version)
    ctx.last_eval = result
    if ctx.prom is not None:
        ctx.prom.observe_eval(result.row())
    if ctx.tracker is not None:
        ctx.tracker.log(iterations_done, {"eval": result.row()})
    if ctx.env.output_dir is not None:
        with open(ctx.env.output_dir / "eval.jsonl", "a") as f:
            f.write(json.dumps(result.row()) + "\n")
        with open(ctx.env.output_dir / "eval-samples.jsonl", "a") as f:  # every answer, judged
            f.writelines(json.dumps(s) + "\n" for s in ctx.evaluator.samples)
    log.info("eval after %d iterations (version %d): pass@1 %.3f pass@%d %.3f on %d prompts", iterations_done,
             version, result.pass_at_1, result.samples, result.pass_at_k, result.prompts)
    return result
