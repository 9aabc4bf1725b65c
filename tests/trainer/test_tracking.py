"""Experiment tracking: the driver's rows land in TensorBoard event files and an MLflow store, read back
with the libraries' own readers; an MLflow server that is down or hangs neither raises nor blocks."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tandem.sidecars.trainer.observe.tracking import Tracker, flatten_metrics
from tandem.spec.models import JobSpec, MLflow, Tracking

LOGGER = "tandem.sidecars.trainer.observe.tracking"


def rows() -> list[dict[str, Any]]:
    return [
        {"iteration": i, "weight_version": i + 1, "reward_mean": 0.25 * i, "kl": None if i == 1 else 0.01 * i,
         "seconds": {"rollout": 1.0 + i, "train": 0.5 * i}, "reward_components": {"answerMatch": 0.1 * i},
         "eval": {"pass_at_1": 0.3 + 0.1 * i}, "loss": float("nan") if i == 2 else 1.0 - 0.1 * i,
         "done": i == 2, "message": "text", "lengths": [1, 2, 3]}
        for i in range(3)
    ]


def scalars(tb_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tb_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


@pytest.fixture
def no_mlflow_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """mlflow's own HTTP settings: no retries, 1 s per request (defaults: 7 retries, 120 s)."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "1")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "0")


def test_flatten_keeps_finite_numbers_by_dotted_name() -> None:
    got = flatten_metrics(rows()[2])
    assert got["seconds.train"] == 1.0 and got["reward_components.answerMatch"] == pytest.approx(0.2)
    assert got["eval.pass_at_1"] == pytest.approx(0.5) and got["kl"] == pytest.approx(0.02)
    assert not {"loss", "done", "message", "lengths"} & set(got)  # nan, bool, str, list


def test_tensorboard_and_mlflow_file_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # for this test's own reader as well
    store = f"file://{tmp_path}/mlruns"
    spec = Tracking(mlflow=MLflow(tracking_uri=store, experiment="tiny", run_name="try-1"))
    tracker = Tracker.create(spec, tmp_path / "run", "tiny-grpo", {"algorithm": {"name": "grpo", "lr": 1e-6},
                                                                      "replicas": 2})
    for row in rows():
        tracker.log(row["iteration"], row)
    tracker.close()

    tb = scalars(tmp_path / "run" / "tensorboard")
    assert tb["seconds/train"] == [(0, 0.0), (1, 0.5), (2, 1.0)]
    assert [s for s, _ in tb["kl"]] == [0, 2]  # None at iteration 1
    assert [s for s, _ in tb["loss"]] == [0, 1]  # nan at iteration 2
    assert tb["eval/pass_at_1"][2][1] == pytest.approx(0.5)
    assert "iteration" not in tb and "done" not in tb

    client = MlflowClient(tracking_uri=store)
    run_id = tracker.mlflow_run_id
    assert run_id is not None
    run = client.get_run(run_id)
    assert run.info.run_name == "try-1" and run.info.status == "FINISHED"
    assert run.data.tags["tandem.job"] == "tiny-grpo"
    assert run.data.params == {"algorithm.name": "grpo", "algorithm.lr": "1e-06", "replicas": "2"}
    assert client.get_experiment(run.info.experiment_id).name == "tiny"
    history = client.get_metric_history(run_id, "reward_components.answerMatch")
    assert [(m.step, round(m.value, 6)) for m in history] == [(0, 0.0), (1, 0.1), (2, 0.2)]
    assert [m.step for m in client.get_metric_history(run_id, "seconds.rollout")] == [0, 1, 2]
    assert [m.step for m in client.get_metric_history(run_id, "kl")] == [0, 2]
    assert set(run.data.metrics) == {"weight_version", "reward_mean", "kl", "seconds.rollout", "seconds.train",
                                     "reward_components.answerMatch", "eval.pass_at_1", "loss"}


def test_tensorboard_off_without_run_dir_or_when_disabled(tmp_path: Path) -> None:
    assert not Tracker.create(Tracking(), None, "j", {}).enabled
    off = Tracker.create(Tracking(tensorboard=False), tmp_path, "j", {})
    off.log(0, rows()[0])
    off.close()
    assert not off.enabled and not (tmp_path / "tensorboard").exists()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A port that accepts connections (kernel backlog) but never answers a request."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.mark.parametrize("server", ["refused", "silent"])
def test_mlflow_down_warns_once_and_training_goes_on(
    server: str, tmp_path: Path, no_mlflow_retries: None, silent_server: str, caplog: pytest.LogCaptureFixture
) -> None:
    uri = f"http://127.0.0.1:{free_port()}" if server == "refused" else silent_server
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    tracker = Tracker.create(Tracking(mlflow=MLflow(tracking_uri=uri)), tmp_path, "j", {"a": 1})
    for row in rows():
        t0 = time.monotonic()
        tracker.log(row["iteration"], row)
        assert time.monotonic() - t0 < 0.5, "log() must not wait for MLflow"
    t0 = time.monotonic()
    tracker.close(close_timeout=20)
    assert time.monotonic() - t0 < 20
    warnings = [r for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert uri in warnings[0].getMessage() and "training goes on" in warnings[0].getMessage()
    assert tracker.mlflow_run_id is None
    assert scalars(tmp_path / "tensorboard")["reward_mean"][-1] == (2, 0.5)  # TensorBoard unaffected


def test_mlflow_close_gives_up_after_the_timeout(
    tmp_path: Path, silent_server: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")  # a server that hangs longer than close waits
    tracker = Tracker.create(Tracking(mlflow=MLflow(tracking_uri=silent_server)), None, "j", {})
    tracker.log(0, rows()[0])
    t0 = time.monotonic()
    tracker.close(close_timeout=1.0)
    assert time.monotonic() - t0 < 5
    assert any("gave up waiting" in r.getMessage() for r in caplog.records if r.name == LOGGER)


def test_spec_fields_and_uri_pattern() -> None:
    base: dict[str, Any] = {"model": {"path": "m"}, "rewards": [{"type": "answerMatch"}], "dataset": {"path": "d"}}
    spec = JobSpec.model_validate(base)
    assert spec.tracking.tensorboard and spec.tracking.mlflow is None
    spec = JobSpec.model_validate({**base, "tracking": {"tensorboard": False, "mlflow": {
        "trackingUri": "http://mlflow.monitoring:5000", "runName": "r"}}})
    assert spec.tracking.mlflow is not None and spec.tracking.mlflow.experiment == "tandem"
    for bad in ("mlflow:5000", "ftp://host", "file://relative", "http://"):
        with pytest.raises(ValueError, match="trackingUri|tracking_uri"):
            JobSpec.model_validate({**base, "tracking": {"mlflow": {"trackingUri": bad}}})
