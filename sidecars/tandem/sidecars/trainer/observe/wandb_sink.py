"""Weights & Biases sink of the trainer's metrics rows (`spec.tracking.wandb`).

Role: one W&B run per job. Its id comes from the job's uid (`run_id`) and it is opened with resume="allow",
so a gang restart or `tandem run --resume` continues the same run, and a job created again under the same
name (a new uid) is a new run in the same group. Project, run name and group default to the job's
namespace, name and name; the config is the job's spec plus `tandem.{job,namespace,uid}`. Every row's finite
numbers are logged against the `iteration` metric (W&B's own step only counts calls: the eval phase logs
the iteration after the row's), names with `/` for the row's nesting (`seconds/train`,
`eval/pass_at_1`); each held-out evaluation adds a row to the `eval/table` table, and after each evaluation
and at the end the `progress` chart (reward and pass@1 per iteration, the plot `tandem run` draws as
progress.png) is logged.

Every W&B call (init included: an unreachable server makes `wandb.init` wait up to its `init_timeout`) runs
on the background thread of `BackgroundSink`: the first failure is one warning and training goes on. The
API key is never in the job: wandb reads WANDB_API_KEY, which the pod gets from
`tracking.wandb.credentialsSecret` (`tandem.operator.manifests.tracking_access`) and `tandem run` from the shell.
WANDB_MODE=offline (or `mode: offline`) writes the run's files only, under `<dir>/wandb/offline-run-*`
(the run directory with `tandem run`), for `wandb sync` later.
Caller: `tracking.Tracker` (created by `Tracker.create` when the spec has `tracking.wandb`).
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Literal

from tandem.sidecars.trainer.observe.background import BackgroundSink
from tandem.spec.tracking import WandB

log = logging.getLogger(__name__)

INIT_TIMEOUT_S = 30.0  # wandb.init's wait for its server (default 90): the sink's thread's, and a closing trainer's
TABLE_COLUMNS = ("iteration", "version", "prompts", "samples", "pass_at_1", "pass_at_k", "k", "reward_mean",
                 "seconds")


def run_id(uid: str) -> str:
    """The W&B run id of the job with metadata.uid `uid` (a restart's is the same: the run continues)."""
    return re.sub(r"[^A-Za-z0-9_-]", "-", uid)[:64] or "tandem"


def directory(run_dir: Path | None) -> Path:
    """Where wandb writes its files: WANDB_DIR, else the trainer's run directory, else the temp dir."""
    if env := os.environ.get("WANDB_DIR"):
        return Path(env)
    return run_dir if run_dir is not None else Path(tempfile.gettempdir())


class WandbSink(BackgroundSink):
    """The job's W&B run, opened on the sink's thread at the first row; never raises into the caller."""

    def __init__(self, spec: WandB, *, job: str, namespace: str, uid: str, params: dict[str, Any],
                 run_dir: Path | None, close_timeout: float) -> None:
        self.spec, self.params, self.close_timeout = spec, params, close_timeout
        self.job, self.namespace, self.uid = job, namespace, uid
        self.id = run_id(uid)
        self.dir = directory(run_dir)
        mode = os.environ.get("WANDB_MODE") or spec.mode  # the shell's or the pod's WANDB_MODE wins
        self.mode: Literal["online", "offline", "disabled", "shared"] = (
            mode if mode in ("online", "offline", "disabled", "shared") else "online")  # type: ignore[assignment]
        self.run: Any = None
        self.evals: dict[int, dict[str, Any]] = {}  # the run's evaluations by iteration: the table's rows
        self.rewards: dict[int, float] = {}
        where = "offline files in " + str(self.dir) if self.mode == "offline" else (spec.base_url or "W&B")
        super().__init__("W&B", where, log)

    def _start(self) -> Any:
        import wandb

        self.dir.mkdir(parents=True, exist_ok=True)
        # wandb's own WANDB_INIT_TIMEOUT, when set, wins (read here: wandb reads its environment once a process)
        settings: dict[str, Any] = {"console": "off", "silent": True, "finish_timeout": self.close_timeout,
                                    "x_disable_stats": True,
                                    "init_timeout": float(os.environ.get("WANDB_INIT_TIMEOUT") or INIT_TIMEOUT_S)}
        if self.spec.base_url is not None:
            settings["base_url"] = self.spec.base_url
        config = {**self.params, "tandem": {"job": self.job, "namespace": self.namespace, "uid": self.uid}}
        run = wandb.init(project=self.spec.project or self.namespace, entity=self.spec.entity,
                         name=self.spec.run_name or self.job, group=self.spec.group or self.job, id=self.id,
                         resume="allow", dir=str(self.dir), mode=self.mode, config=config,
                         tags=["tandem", *self._algorithm(), *self.spec.tags], job_type="rl-fine-tuning",
                         settings=wandb.Settings(**settings))
        run.define_metric("iteration")
        run.define_metric("*", step_metric="iteration")
        self.run = run
        log.info("W&B run %s (%s) in project %r, %s", self.id, self.spec.run_name or self.job,
                 self.spec.project or self.namespace, self.where)
        return run

    def _algorithm(self) -> list[str]:
        algorithm = self.params.get("algorithm")
        name = algorithm.get("name") if isinstance(algorithm, dict) else None
        return [name] if isinstance(name, str) else []

    def _log(self, step: int, payload: dict[str, Any], stamp: int) -> None:
        import wandb

        run = self.run if self.run is not None else self._start()
        metrics: dict[str, float] = payload["metrics"]
        ev = payload.get("eval")
        fresh = isinstance(ev, dict) and isinstance(ev.get("iteration"), int) and ev["iteration"] not in self.evals
        if isinstance(ev, dict) and not fresh:  # the row after an eval carries it again: logged at its own iteration
            metrics = {k: v for k, v in metrics.items() if not k.startswith("eval.")}
        if "reward_mean" in metrics:
            self.rewards[step] = metrics["reward_mean"]
        entry: dict[str, Any] = {name.replace(".", "/"): value for name, value in metrics.items()}
        if fresh and isinstance(ev, dict):
            self.evals[ev["iteration"]] = ev
            rows = [[self.evals[i].get(c) for c in TABLE_COLUMNS] for i in sorted(self.evals)]
            entry["eval/table"] = wandb.Table(columns=list(TABLE_COLUMNS), data=rows)
            entry["progress"] = self._progress_chart()
        if entry:
            run.log({**entry, "iteration": step})

    def _progress_chart(self) -> Any:
        """Reward and held-out pass@1 per iteration, as a W&B line chart (progress.png's first panel)."""
        import wandb

        its = sorted(self.rewards)
        evals = sorted(self.evals)
        return wandb.plot.line_series(xs=[its, evals], ys=[[self.rewards[i] for i in its],
                                                           [self.evals[i]["pass_at_1"] for i in evals]],
                                      keys=["reward", "held-out pass@1"], title="progress", xname="iteration")

    def _end(self) -> None:
        if self.run is None:
            return
        if self.rewards:
            self.run.log({"progress": self._progress_chart(), "iteration": max(self.rewards)})
        self.run.finish(exit_code=1 if self.failed_run else 0)
