"""Control API over the live engine and over a publisher: token check and typed status codes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import tiny_model
from fastapi import APIRouter, Depends
from fastapi.testclient import TestClient

from tandem.checkpoint_engine.service.api import create_app
from tandem.checkpoint_engine.service.publisher import Publisher
from tandem.sidecars.rollout_engine.engine import EngineConfig, RolloutEngine
from tandem.sidecars.rollout_engine.routes import create_app as rollout_app

TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.mark.vllm
@pytest.mark.etcd
def test_rollout_api_codes(live_engine: RolloutEngine, live_publisher: Any, tiny_dir: Path) -> None:
    client = TestClient(rollout_app(live_engine, TOKEN))
    assert client.get("/health").status_code == 200
    assert client.get("/status").status_code == 401
    assert client.get("/status", headers={"Authorization": "Bearer nope"}).status_code == 401
    assert client.post("/update", json={}).status_code == 401
    st = client.get("/status", headers=AUTH)
    assert st.status_code == 200 and st.json()["phase"] == "ready"

    r = client.post("/start", json={"model_dir": str(tiny_dir)}, headers=AUTH)
    assert r.status_code == 409 and r.json()["error"] == "wrong_phase"
    r = client.post("/update", json={"version": 987654}, headers=AUTH)
    assert r.status_code == 404 and r.json()["error"] == "version_not_found"

    bad = tiny_model.random_state_dict(41)
    bad["model.embed_tokens.weight"] = bad["model.embed_tokens.weight"][:10]
    live_publisher.publish(None, bad.items())
    r = client.post("/update", json={}, headers=AUTH)
    assert r.status_code == 422 and r.json()["error"] == "invalid_version"
    assert "model.embed_tokens.weight" in r.json()["detail"]
    r = client.post("/update", json={"version": -1}, headers=AUTH)
    assert r.status_code == 422

    rep = live_publisher.publish(None, tiny_model.random_state_dict(42).items())
    r = client.post("/update", json={"version": rep.version}, headers=AUTH)
    assert r.status_code == 200, r.text
    assert r.json()["status"]["version"] == rep.version and r.json()["report"]["bytes"] == rep.bytes
    status = live_engine.registry.get_status("pod0", "rollout")  # type: ignore[union-attr]
    assert status is not None and status["version"] == rep.version and status["phase"] == "ready"
    ops = live_engine.registry.ops()  # type: ignore[union-attr]
    assert ops[-1]["op"] == "update" and ops[-1]["state"] == "done" and ops[-1]["version"] == rep.version
    assert any(o["state"] == "failed" and o["error"].startswith("InvalidVersion") for o in ops)


def test_stopped_engine_and_extension_router(tmp_path: Path) -> None:
    engine = RolloutEngine(EngineConfig(shm_root=tmp_path, job="x"))  # never started, no etcd
    app = rollout_app(engine, TOKEN)
    extra = APIRouter()

    @extra.get("/generate_ping")
    def ping() -> dict[str, str]:
        return {"pong": "yes"}

    app.include_router(extra, dependencies=[Depends(app.state.auth)])
    client = TestClient(app)
    assert client.post("/terminate", headers=AUTH).status_code == 200
    r = client.post("/sleep", json={"level": 1}, headers=AUTH)
    assert r.status_code == 503 and r.json()["error"] == "engine_not_running"
    assert client.post("/update", json={"version": 1}, headers=AUTH).status_code == 405  # no registry
    assert client.get("/generate_ping").status_code == 401
    assert client.get("/generate_ping", headers=AUTH).json() == {"pong": "yes"}


def test_token_is_required(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = RolloutEngine(EngineConfig(shm_root=tmp_path, job="x"))
    monkeypatch.delenv("TANDEM_TOKEN", raising=False)
    with pytest.raises(ValueError, match="token"):
        rollout_app(engine)
    monkeypatch.setenv("TANDEM_TOKEN", "from-env")
    client = TestClient(rollout_app(engine))
    assert client.get("/status", headers={"Authorization": "Bearer from-env"}).status_code == 200


@pytest.mark.etcd
def test_publisher_api(make_registry: Any, shm_root: Path, job: str) -> None:
    pub = Publisher(shm_root, job, make_registry(), keep=1)
    for v in (1, 2):
        pub.publish(v, tiny_model.random_state_dict(v).items())
    client = TestClient(create_app(pub, TOKEN))
    st = client.get("/status", headers=AUTH).json()
    assert st["version"] == 2 and st["phase"] == "idle" and st["role"] == "trainer"
    assert client.post("/gc", headers=AUTH).status_code == 200
    r = client.post("/update", json={}, headers=AUTH)
    assert r.status_code == 405 and r.json()["error"] == "unsupported"


def scrape(client: TestClient, metric: str, **labels: str) -> float | None:
    from prometheus_client.parser import text_string_to_metric_families

    r = client.get("/metrics")  # no token: scraped like /health
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            if s.name == metric and labels.items() <= s.labels.items():
                return float(s.value)
    return None


@pytest.mark.etcd
def test_metrics_follow_the_engine_status(make_registry: Any, shm_root: Path, job: str, tmp_path: Path) -> None:
    from prometheus_client import CollectorRegistry, Counter

    extra = CollectorRegistry()
    Counter("tandem_test_marker", "a caller's own metric", registry=extra).inc(3)
    pub = Publisher(shm_root, job, make_registry(), keep=1)
    client = TestClient(create_app(pub, TOKEN, extra))
    assert scrape(client, "tandem_engine_version", role="trainer") is None  # nothing published yet
    assert scrape(client, "tandem_engine_phase", role="trainer", phase="idle") == 1.0  # a publisher starts idle
    report = pub.publish(7, tiny_model.random_state_dict(7).items())
    assert scrape(client, "tandem_engine_version", role="trainer") == 7
    assert scrape(client, "tandem_engine_phase", role="trainer", phase="idle") == 1.0
    assert scrape(client, "tandem_engine_phase", role="trainer", phase="publishing") == 0.0
    assert scrape(client, "tandem_engine_step_seconds", role="trainer", step="write") == pytest.approx(report.write_s)
    assert scrape(client, "tandem_engine_error", role="trainer") == 0.0
    assert scrape(client, "tandem_test_marker_total") == 3.0  # the caller's registry is served too

    engine = RolloutEngine(EngineConfig(shm_root=tmp_path, job="x"))  # never started
    client = TestClient(rollout_app(engine, TOKEN))
    assert scrape(client, "tandem_engine_phase", role="rollout", phase="stopped") == 1.0
