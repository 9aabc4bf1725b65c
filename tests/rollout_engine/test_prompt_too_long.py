"""A prompt with no room for a generated token, sent to the rollout's HTTP API (`/v1/generate` of
`tandem.sidecars.rollout.http_app` over the session's one real vLLM engine, max_model_len 256): a typed
400 naming the prompt and the limit, nothing generated, and the engine serves the next request as before.
A request vLLM itself refuses (an empty prompt) is a 400 too, never a FAILED engine."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from tandem.checkpoint_engine.service.engine_status import Phase
from tandem.sidecars.rollout.http_app import build_app
from tandem.sidecars.rollout_engine.engine import RolloutEngine

TOKEN = "t0k"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
LIMIT = 256  # conftest.live_engine's max_model_len


def generate(client: TestClient, prompts: list[Any], max_tokens: int = 4) -> Any:
    body = {"prompts": prompts, "n": 1, "options": {"temperature": 0.0, "max_tokens": max_tokens}}
    return client.post("/v1/generate", json=body, headers=AUTH)


def assert_serving(engine: RolloutEngine) -> None:
    assert engine.phase == Phase.READY and engine.error is None and engine.status().phase == Phase.READY


@pytest.mark.vllm
@pytest.mark.etcd
def test_a_too_long_prompt_is_a_400_and_the_engine_keeps_serving(live_engine: RolloutEngine) -> None:
    client = TestClient(build_app(live_engine, TOKEN))
    ok = generate(client, [[5] * 8])
    assert ok.status_code == 200, ok.text
    assert len(ok.json()["completions"][0][0]["token_ids"]) == 4

    for prompts, index, tokens in (([[5] * LIMIT], 0, LIMIT), ([[5] * 8, [6] * 300], 1, 300)):
        r = generate(client, prompts)
        assert r.status_code == 400, r.text
        body = r.json()
        assert body["error"] == "prompt_too_long" and body["type"] == "PromptTooLong"
        assert f"prompt {index} has {tokens} tokens" in body["detail"]
        assert f"(max_model_len) is {LIMIT} tokens, so a prompt may have at most {LIMIT - 1}" in body["detail"]
        assert_serving(live_engine)

    text = " ".join(["alpha beta gamma"] * 120)  # a text prompt: counted with the engine's own tokenizer
    r = generate(client, [text])
    assert r.status_code == 400 and r.json()["error"] == "prompt_too_long", r.text

    r = generate(client, [[]])  # refused by vLLM itself (an empty prompt): a 400 as well
    assert r.status_code == 400 and r.json()["error"] == "bad_request" and "empty" in r.json()["detail"], r.text
    assert_serving(live_engine)

    edge = generate(client, [[5] * (LIMIT - 1)])  # room for exactly one token
    assert edge.status_code == 200, edge.text
    completion = edge.json()["completions"][0][0]
    assert len(completion["token_ids"]) == 1 and completion["finish_reason"] == "length"
    again = generate(client, [[5] * 8])
    assert again.status_code == 200 and again.json()["completions"][0][0]["token_ids"] == \
        ok.json()["completions"][0][0]["token_ids"]  # greedy: the same weights answer the same
    assert_serving(live_engine)
