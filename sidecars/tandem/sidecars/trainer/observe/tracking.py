"""Experiment tracking of the trainer's metrics rows: TensorBoard event files, MLflow and W&B when configured.

Role: the driver rank hands each row it appends to metrics.jsonl to `Tracker.log(iteration, row)`.
Nested dicts are flattened with dots (`seconds.train`, `reward_components.answerMatch`,
`eval.pass_at_1`) and only finite numbers are logged (bools, strings, lists, NaN and inf are
skipped), with the iteration as the step. Callers: the trainer's loop (`tandem.sidecars.trainer.loop`:
`start`, `report`, `evaluate`): `Tracker.create(spec.tracking, run_dir, job_name, params, namespace=, uid=)`
once, `log` per iteration, `close` at the end. Settings: `spec.tracking` (`tandem.spec.tracking.Tracking`).

- TensorBoard: torch.utils.tensorboard's SummaryWriter in `<run_dir>/tensorboard/` (tags use `/`
  instead of `.`, so TensorBoard groups `seconds/*`); off when `tracking.tensorboard` is false or the
  trainer has no run directory.
- MLflow: an `MlflowClient` (no process-global fluent run) logging to `tracking.mlflow.trackingUri`,
  a server or a `file:///` store (MLFLOW_ALLOW_FILE_STORE is defaulted to true for it): one run per
  Tracker (tag `tandem.job`), `params` flattened as run params.
  Every MLflow call runs on one background thread behind a bounded queue (`background.BackgroundSink`),
  so a slow or unreachable server never blocks or fails training: the first failure logs one warning, later ones are
  retried with the next row (debug log), a full queue drops the oldest row, and `close` waits at most
  `close_timeout` seconds. mlflow's own HTTP settings apply per request
  (MLFLOW_HTTP_REQUEST_TIMEOUT, MLFLOW_HTTP_REQUEST_MAX_RETRIES, MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR).
  Credentials are never in the URI: mlflow reads MLFLOW_TRACKING_USERNAME / _PASSWORD (basic auth) or
  _TOKEN (bearer) from the environment, which the pod gets from `tracking.mlflow.credentialsSecret`
  (`tandem.operator.manifests.tracking_access`) and `tandem run` from the invoking shell. Log lines name the
  server by `redact(uri)`.
- Weights & Biases: `wandb_sink.WandbSink`, the same background thread and queue; one run per job (its id
  from the job's uid, resumed by a restart), WANDB_API_KEY from `tracking.wandb.credentialsSecret`.
"""

from __future__ import annotations

import json
import logging
import math
import numbers
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tandem.sidecars.trainer.observe.background import BackgroundSink
from tandem.sidecars.trainer.observe.wandb_sink import WandbSink
from tandem.spec.models import MLflow, Tracking

log = logging.getLogger(__name__)

CLOSE_TIMEOUT_S = 30.0
_MAX_PARAM_VALUE = 6000  # mlflow.utils.validation.MAX_PARAM_VAL_LENGTH
_MAX_KEY = 250  # MAX_ENTITY_KEY_LENGTH
_BAD_NAME_CHARS = re.compile(r"[^\w\-. :/]")  # mlflow accepts alphanumerics, _ - . space : /
_USERINFO = re.compile(r"([a-z][a-z0-9+.-]*://)[^/?#\s]*@", re.IGNORECASE)  # the user:password@ of a URL


def flatten_metrics(row: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """Finite numeric leaves of `row` by dotted name; bools and non-numbers are left out."""
    out: dict[str, float] = {}
    for key, value in row.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten_metrics(value, name + "."))
        elif isinstance(value, numbers.Real) and not isinstance(value, bool):
            number = float(value)
            if math.isfinite(number):
                out[name] = number
    return out


def flatten_params(params: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Leaves of `params` by dotted name as strings (lists and None as JSON)."""
    out: dict[str, str] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten_params(value, name + "."))
        else:
            out[name] = value if isinstance(value, str) else json.dumps(value, default=str)
    return out


def redact(text: str) -> str:
    """`text` (a URI, an error message) with the user:password@ of every URL in it replaced by ***@, for
    log lines. The spec refuses such a tracking URI (credentials come from credentialsSecret); this keeps
    one out of the logs regardless."""
    return _USERINFO.sub(r"\1***@", text)


def mlflow_name(name: str) -> str:
    """`name` with the characters MLflow refuses in metric and param keys replaced by `_`."""
    return _BAD_NAME_CHARS.sub("_", name).strip("/")[:_MAX_KEY] or "_"


class _MLflowWorker(BackgroundSink):
    """One MLflow run fed from the queue by the sink's thread; never raises into the caller."""

    def __init__(self, spec: MLflow, run_name: str, params: dict[str, str], tags: dict[str, str]) -> None:
        self.spec, self.run_name, self.params, self.tags = spec, run_name, params, tags
        self.run_id: str | None = None
        self._client: Any = None
        super().__init__("MLflow", redact(spec.tracking_uri), log)

    def _clean(self, text: str) -> str:
        return redact(text)

    def _end(self) -> None:
        if self.run_id is not None:
            self._client.set_terminated(self.run_id, status="FAILED" if self.failed_run else "FINISHED")

    def _start_run(self) -> str:
        from mlflow.entities import Param
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        if self._client is None:
            if self.spec.tracking_uri.startswith("file:"):
                # mlflow 3 refuses file stores unless opted in; asking for file:// is that opt-in
                os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            self._client = MlflowClient(tracking_uri=self.spec.tracking_uri)
        client = self._client
        experiment = client.get_experiment_by_name(self.spec.experiment)
        if experiment is not None:
            experiment_id = experiment.experiment_id
        else:
            try:
                experiment_id = client.create_experiment(self.spec.experiment)
            except MlflowException:  # created meanwhile by another job
                experiment = client.get_experiment_by_name(self.spec.experiment)
                if experiment is None:
                    raise
                experiment_id = experiment.experiment_id
        run = client.create_run(experiment_id, run_name=self.run_name, tags=self.tags)
        params = [Param(mlflow_name(k), v[:_MAX_PARAM_VALUE]) for k, v in sorted(self.params.items())]
        for i in range(0, len(params), 100):  # MAX_PARAMS_TAGS_PER_BATCH
            client.log_batch(run.info.run_id, params=params[i : i + 100])
        self.run_id = str(run.info.run_id)
        log.info("MLflow run %s (%s) in experiment %r at %s", self.run_id, self.run_name, self.spec.experiment,
                 self.where)
        return self.run_id

    def _log(self, step: int, metrics: dict[str, Any], stamp: int) -> None:
        from mlflow.entities import Metric

        run_id = self.run_id if self.run_id is not None else self._start_run()
        entries = [Metric(mlflow_name(k), v, stamp, step) for k, v in metrics.items()]
        for i in range(0, len(entries), 1000):  # MAX_METRICS_PER_BATCH
            self._client.log_batch(run_id, metrics=entries[i : i + 1000])


def _installed(module: str, field: str, name: str) -> bool:
    """Whether `module` imports; an image that lacks it is told once, at start, and that sink stays off."""
    import importlib

    try:
        importlib.import_module(module)
    except ImportError as e:
        log.error("%s: %s is not installed in this image (%s); %s is off", field, module.split(".")[0], e, name)
        return False
    return True


class Tracker:
    """TensorBoard, MLflow and W&B sinks of the driver's metrics rows; any may be absent."""

    def __init__(self, tensorboard: Any = None, mlflow: _MLflowWorker | None = None,
                 tensorboard_dir: Path | None = None, wandb: WandbSink | None = None) -> None:
        self._tb = tensorboard
        self._mlflow = mlflow
        self._wandb = wandb
        self._closed = False
        self.tensorboard_dir = tensorboard_dir if tensorboard is not None else None

    @classmethod
    def create(cls, spec: Tracking, run_dir: Path | None, job_name: str, params: Mapping[str, Any], *,
               namespace: str = "default", uid: str = "local", close_timeout: float = CLOSE_TIMEOUT_S) -> Tracker:
        """Open the sinks `spec` asks for; a sink that cannot start logs why and stays off. `namespace` and
        `uid` are the job's (W&B's project and run id)."""
        writer, tb_dir = None, None
        if spec.tensorboard and run_dir is not None:
            tb_dir = Path(run_dir) / "tensorboard"
            try:
                from torch.utils.tensorboard import SummaryWriter

                tb_dir.mkdir(parents=True, exist_ok=True)
                writer = SummaryWriter(log_dir=str(tb_dir), flush_secs=30)
                text = json.dumps(dict(params), indent=1, sort_keys=True, default=str)
                writer.add_text("params", "```json\n" + text + "\n```", 0)
            except (ImportError, OSError) as e:
                log.error("tracking.tensorboard: cannot write TensorBoard events to %s (%s); it is off", tb_dir, e)
                writer = None
        worker = None
        if spec.mlflow is not None and _installed("mlflow.tracking", "tracking.mlflow", "MLflow"):
            worker = _MLflowWorker(spec.mlflow, spec.mlflow.run_name or job_name, flatten_params(params),
                                   {"tandem.job": job_name})
        sink = None
        if spec.wandb is not None and _installed("wandb", "tracking.wandb", "W&B"):
            sink = WandbSink(spec.wandb, job=job_name, namespace=namespace, uid=uid, params=dict(params),
                             run_dir=run_dir, close_timeout=close_timeout)
        return cls(writer, worker, tb_dir, sink)

    @property
    def enabled(self) -> bool:
        return self._tb is not None or self._mlflow is not None or self._wandb is not None

    @property
    def wandb_run_id(self) -> str | None:
        """The W&B run's id once the background thread has opened it."""
        return None if self._wandb is None or self._wandb.run is None else self._wandb.id

    @property
    def mlflow_run_id(self) -> str | None:
        """The MLflow run's id once the background thread has created it."""
        return None if self._mlflow is None else self._mlflow.run_id

    def log(self, iteration: int, row: Mapping[str, Any]) -> dict[str, float]:
        """Log `row`'s finite numbers at step `iteration` (its own "iteration" key is the step); returns them."""
        metrics = flatten_metrics({k: v for k, v in row.items() if k != "iteration"})
        if self._tb is not None:
            try:
                for name, value in metrics.items():
                    self._tb.add_scalar(name.replace(".", "/"), value, iteration)
            except OSError as e:
                log.error("tracking.tensorboard: writing to %s failed (%s); it is off", self.tensorboard_dir, e)
                self._tb = None
        if self._mlflow is not None and metrics and not self._closed:
            self._mlflow.submit(iteration, metrics)
        if self._wandb is not None and metrics and not self._closed:
            self._wandb.submit(iteration, {"metrics": metrics, "eval": row.get("eval")})
        return metrics

    def close(self, failed: bool = False, close_timeout: float = CLOSE_TIMEOUT_S) -> None:
        """Flush TensorBoard, end the MLflow and W&B runs (failed when `failed`), waiting at most `close_timeout`
        s for each."""
        if self._tb is not None:
            try:
                self._tb.close()
            except OSError as e:
                log.error("tracking.tensorboard: closing %s failed: %s", self.tensorboard_dir, e)
            self._tb = None
        if self._mlflow is not None and not self._closed:
            self._mlflow.close(failed, close_timeout)
        if self._wandb is not None and not self._closed:
            self._wandb.close(failed, close_timeout)
        self._closed = True
