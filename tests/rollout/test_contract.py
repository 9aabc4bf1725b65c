"""The one contract between trainer and rollout (`tandem.sidecars.rollout_engine.contract`): what the trainer's
client sends is the JSON the rollout's server parses, field for field, and the answers the server builds are what
the client reads; a bad request is refused naming the field. The real app (`rollout.http_app.build_app`) over a
stand-in engine (no vLLM), the real client (`RolloutClient`) over it."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from tandem.checkpoint_engine.service.engine_status import EngineStatus, Phase, UpdateReport
from tandem.sidecars.rollout.http_app import build_app
from tandem.sidecars.rollout_engine.contract import (
    Completion,
    GenerateRequest,
    Health,
    SamplingOptions,
    UpdateRequest,
)
from tandem.sidecars.trainer.loop.rollout.rollout_client import RolloutClient
from tandem.sidecars.trainer.loop.rollout.rollout_health import deadline_of

TOKEN = "t0k"


class StandIn:
    """What the routes use of a RolloutEngine: generate and update recorded, a status."""

    def __init__(self) -> None:
        self.version: int | None = 3
        self.restarts, self.recovering = 1, False
        self.recovery = SimpleNamespace(recoveries=1, last_s=2.5)
        self.calls: list[tuple[str, Any]] = []

    def status(self) -> EngineStatus:
        return EngineStatus(role="rollout", phase=Phase.READY, version=self.version, stall_deadline_s=6.12345,
                            stall_deadline="20x the p99")

    def generate(self, prompts: Any, options: SamplingOptions, n: int, max_tokens: Any,
                 images: Any = None) -> list[list[Completion]]:
        self.calls.append(("generate", (prompts, options, n, max_tokens, images)))
        return [[Completion(prompt_index=i, sample_index=j, prompt_token_ids=[], token_ids=[i, j],
                            logprobs=[-0.5, -1.0], text=f"{i}.{j}") for j in range(n)] for i, _ in enumerate(prompts)]

    def update(self, version: int | None) -> UpdateReport:
        self.calls.append(("update", version))
        previous, self.version = self.version, version
        return UpdateReport(version=version or 0, previous=previous, bytes=8, tensors=1)


def wired() -> tuple[StandIn, RolloutClient, list[tuple[str, Any]]]:
    """A stand-in engine behind the real app, the real client sending to it; the bodies as sent."""
    engine = StandIn()
    sent: list[tuple[str, Any]] = []

    def record(request: httpx.Request) -> None:
        sent.append((request.url.path, json.loads(request.content or b"{}")))

    http = TestClient(build_app(engine, TOKEN), headers={"Authorization": f"Bearer {TOKEN}"})  # type: ignore[arg-type]
    http.event_hooks = {"request": [record]}
    client = RolloutClient(["rollout:8000"], TOKEN)
    client._http.close()
    client._http = http
    return engine, client, sent


def test_what_the_client_sends_is_what_the_server_parses() -> None:
    engine, client, sent = wired()
    options = SamplingOptions(temperature=0.5, max_tokens=5, stop=["\n"])
    out, versions = client.generate([[1, 2], "two"], options, n=2, max_tokens=[3, 4])
    [(path, body)] = sent
    assert path == "/v1/generate" and set(body) == {"prompts", "options", "n", "max_tokens", "images"}
    parsed = GenerateRequest.model_validate(body)
    assert parsed.model_dump(mode="json") == body  # the server's model reads it and writes the same JSON
    assert engine.calls == [("generate", (parsed.prompts, parsed.options, 2, [3, 4], None))]
    assert parsed.options == options
    assert versions == {3} and [[c.text for c in g] for g in out] == [["0.0", "0.1"], ["1.0", "1.1"]]
    assert client.faults.engines == {"rollout:8000": (1, 1)}  # the answer's restarts and recoveries, read

    client.update(4)
    assert sent[-1] == ("/update", {"version": 4}) == ("/update", UpdateRequest(version=4).model_dump(mode="json"))
    assert engine.calls[-1] == ("update", 4) and client.expected == 4


def test_pictures_travel_as_base64_and_arrive_as_images() -> None:
    from PIL import Image

    from tandem.sidecars.rollout_engine.contract import encode_image

    engine = StandIn()
    http = TestClient(build_app(engine, TOKEN), headers={"Authorization": f"Bearer {TOKEN}"})
    picture = Image.new("RGBA", (5, 3), (9, 8, 7, 255))
    body = GenerateRequest(prompts=[[1, 2], [3]], images=[[encode_image(picture)], []]).model_dump(mode="json")
    assert http.post("/v1/generate", json=body).status_code == 200
    engine2, client, sent = wired()  # and the trainer's client sends them so
    client.generate([[1, 2], [3]], SamplingOptions(), n=1, images=[[picture], []])
    assert sent[0][1]["images"] == body["images"] and engine2.calls[0][1][4] is not None
    [(_, (_, _, _, _, images))] = engine.calls
    assert [[(i.mode, i.size, i.getpixel((0, 0))) for i in row] for row in images] == [[("RGB", (5, 3), (9, 8, 7))], []]
    body["images"] = [["aGVsbG8="], []]  # base64 of "hello": no picture
    r = http.post("/v1/generate", json=body)
    assert r.status_code == 400 and "prompt 0, picture 0: not a picture" in r.text


@pytest.mark.parametrize(("path", "body", "field"), [
    ("/v1/generate", {"prompts": [[1]], "n": 0}, "n"),
    ("/v1/generate", {"prompts": []}, "prompts"),
    ("/v1/generate", {"prompts": [[1]], "options": {"top_p": 0}}, "top_p"),
    ("/update", {"version": -1}, "version"),
    ("/sleep", {"level": 3}, "level"),
])
def test_a_bad_request_is_refused_naming_the_field(path: str, body: dict[str, Any], field: str) -> None:
    engine = StandIn()
    r = TestClient(build_app(engine, TOKEN)).post(path, json=body, headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 422, r.text
    assert any(field in d["loc"] for d in r.json()["detail"]), r.text
    assert engine.calls == []


def test_the_client_refuses_a_bad_request_before_sending_it() -> None:
    with pytest.raises(ValidationError, match="n"):
        GenerateRequest(prompts=[[1]], n=0)


def test_health_is_one_model_on_both_sides() -> None:
    body = TestClient(build_app(StandIn(), TOKEN)).get("/health").json()
    assert set(body) == {"ok", "phase", "version", "steps", "stalledS", "busy", "restarts", "error",
                         "stallDeadlineS", "stallDeadline", "recoveries", "recoveryS", "pids", "spare", "sparesTaken"}
    assert body["stallDeadlineS"] == 6.123 and body["phase"] == "ready"
    health = Health.model_validate(body)
    assert health.body() == body
    assert deadline_of(health, 120.0) == deadline_of(body, 120.0) == (6.123, "20x the p99")
