"""MLflow credentials end to end: the trainer container's env as the builders write it (secretKeyRef to
`tracking.mlflow.credentialsSecret`), resolved from a Secret as a kubelet would, and the real MlflowClient
behind the project's `Tracker` logging to a local HTTP server that demands basic auth. The server sees
the Secret's credentials on every call; no log line or output shows the password; a URI that carries
credentials (refused by the spec, forced here) is redacted in every log line."""

from __future__ import annotations

import base64
import json
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlparse

import pytest

from tandem.operator.manifests import builders
from tandem.sidecars.trainer.observe.tracking import Tracker, redact
from tandem.spec.load import parse_job
from tandem.spec.models import MLflow, Tracking

SECRET = {"username": "alice", "password": "pw-Kq7-never-logged"}  # the Secret's data, as the kubelet reads it
LOGGER = "tandem.sidecars.trainer.observe.tracking"


class MlflowStandIn(ThreadingHTTPServer):
    """Answers the REST calls MlflowClient makes for a run (an experiment, a run, batches, its end); any
    request without `Authorization: Basic <user:password>` gets 401. Records (path, Authorization)."""

    def __init__(self, user: str, password: str) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.expected = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        self.calls: list[tuple[str, str]] = []
        self.metrics: list[dict[str, Any]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: MlflowStandIn

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass

    def _answer(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _handle(self) -> None:
        path = urlparse(self.path).path
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        auth = self.headers.get("Authorization", "")
        self.server.calls.append((path, auth))
        if auth != self.server.expected:
            return self._answer(401, {"error_code": "UNAUTHENTICATED", "message": "credentials required"})
        info = {"run_id": "r1", "run_uuid": "r1", "experiment_id": "1", "status": "RUNNING", "start_time": 1,
                "lifecycle_stage": "active", "run_name": body.get("run_name", "")}
        if path.endswith("/experiments/get-by-name"):
            return self._answer(404, {"error_code": "RESOURCE_DOES_NOT_EXIST", "message": "no such experiment"})
        if path.endswith("/experiments/create"):
            return self._answer(200, {"experiment_id": "1"})
        if path.endswith(("/runs/create", "/runs/get")):
            return self._answer(200, {"run": {"info": info, "data": {}}})
        if path.endswith("/runs/log-batch"):
            self.server.metrics += body.get("metrics", [])
            return self._answer(200, {})
        if path.endswith("/runs/update"):
            return self._answer(200, {"run_info": {**info, "status": body.get("status", "FINISHED")}})
        return self._answer(404, {"error_code": "ENDPOINT_NOT_FOUND", "message": path})

    do_GET = do_POST = do_PATCH = _handle


@pytest.fixture
def server() -> Iterator[MlflowStandIn]:
    srv = MlflowStandIn(SECRET["username"], SECRET["password"])
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


@pytest.fixture(autouse=True)
def quick_mlflow(monkeypatch: pytest.MonkeyPatch) -> None:
    """mlflow's HTTP settings: no retries (defaults: 7 with backoff); the shell's credentials not inherited."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    for var in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN"):
        monkeypatch.delenv(var, raising=False)


def trainer_env_from_secret(uri: str, secret: dict[str, str]) -> dict[str, str]:
    """The trainer container's MLFLOW_TRACKING_* as a kubelet resolves the builders' secretKeyRefs."""
    job = parse_job({"apiVersion": "tandem.dev/v1alpha1", "kind": "RLHFJob", "metadata": {"name": "j"},
                     "spec": {"model": {"path": "/m"}, "dataset": {"path": "/d.jsonl"},
                              "rewards": [{"type": "answerMatch"}],
                              "tracking": {"mlflow": {"trackingUri": uri, "credentialsSecret": "mlflow-creds"}}}})
    trainer = builders.trainer_container(job, 0, 0, "http://etcd:2379")
    out = {}
    for item in trainer["env"]:
        ref = item.get("valueFrom", {}).get("secretKeyRef", {})
        if ref.get("name") == "mlflow-creds" and ref["key"] in secret:
            out[item["name"]] = secret[ref["key"]]
    return out


def run_tracker(uri: str) -> Tracker:
    tracker = Tracker.create(Tracking(tensorboard=False, mlflow=MLflow(tracking_uri=uri, experiment="auth")),
                             None, "j", {"algorithm": {"lr": 1e-6}})
    for i in range(2):
        tracker.log(i, {"iteration": i, "reward_mean": 0.5 * i})
    tracker.close(close_timeout=60)
    return tracker


def test_the_secrets_credentials_reach_mlflow_and_no_log_shows_them(
    server: MlflowStandIn, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str]
) -> None:
    env = trainer_env_from_secret(server.url, SECRET)
    assert env == {"MLFLOW_TRACKING_USERNAME": "alice", "MLFLOW_TRACKING_PASSWORD": SECRET["password"]}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    caplog.set_level(logging.DEBUG)  # every logger, mlflow's and urllib3's included
    tracker = run_tracker(server.url)

    assert tracker.mlflow_run_id == "r1", [r.getMessage() for r in caplog.records]
    paths = [p for p, _ in server.calls]
    assert any(p.endswith("/runs/create") for p in paths) and paths[-1].endswith("/runs/update")
    assert {auth for _, auth in server.calls} == {server.expected}  # the first call and every later one
    assert sorted((m["key"], m["step"]) for m in server.metrics) == [("reward_mean", 0), ("reward_mean", 1)]
    out, err = capfd.readouterr()
    logged = "\n".join(r.getMessage() for r in caplog.records) + caplog.text + out + err
    assert SECRET["password"] not in logged and server.expected.split()[1] not in logged


def test_wrong_credentials_warn_once_without_the_password(
    server: MlflowStandIn, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str]
) -> None:
    wrong = {**SECRET, "password": "pw-wrong-also-secret"}
    for name, value in trainer_env_from_secret(server.url, wrong).items():
        monkeypatch.setenv(name, value)
    caplog.set_level(logging.DEBUG)
    tracker = run_tracker(server.url)
    assert tracker.mlflow_run_id is None and server.calls  # refused with 401; training went on
    sent = "Basic " + base64.b64encode(b"alice:pw-wrong-also-secret").decode()
    assert {auth for _, auth in server.calls} == {sent}
    warnings = [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "UNAUTHENTICATED" in warnings[0], warnings
    out, err = capfd.readouterr()
    assert "pw-wrong-also-secret" not in caplog.text + out + err and sent.split()[1] not in caplog.text + out + err


def test_a_uri_with_credentials_is_redacted_in_every_log_line(
    server: MlflowStandIn, caplog: pytest.LogCaptureFixture
) -> None:
    """Such a URI is refused by the spec (a job stored before that rule, or built around it): still no leak."""
    host = server.url.removeprefix("http://")
    forced = MLflow.model_construct(tracking_uri=f"http://bob:pw-in-uri@{host}", experiment="auth",
                                    run_name=None, credentials_secret=None)
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    tracker = Tracker.create(Tracking.model_construct(tensorboard=False, mlflow=forced), None, "j", {})
    tracker.log(0, {"reward_mean": 1.0})
    tracker.close(close_timeout=60)
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert any(f"http://***@{host}" in line for line in lines), lines
    assert not any("pw-in-uri" in line for line in lines), lines
    assert redact("failed: http://u:p@h:1/x and https://t@h/y") == "failed: http://***@h:1/x and https://***@h/y"
