"""RolloutClient when rollouts leave (a scale-down of the rollout-only pool): their prompts go to the
others, in place; an error a rollout answers still fails; losing every rollout fails. Real HTTP
servers on loopback stand for the rollout sidecars' API (/v1/generate, /update)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tandem.checkpoint_engine.models import SamplingOptions
from tandem.sidecars.trainer.loop.rollout_client import RolloutClient, RolloutError


class Rollout:
    """A fake rollout sidecar: each completion's text names the prompt and who generated it."""

    def __init__(self, name: str, status: int = 200):
        self.name, self.status, self.calls = name, status, []  # type: ignore[var-annotated]
        self.hang_ups = 0  # requests answered by closing the connection (a keep-alive closed as one arrives)
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.calls.append((self.path, body))
                if outer.hang_ups:
                    outer.hang_ups -= 1
                    self.close_connection = True
                    return
                answer: dict[str, Any] = {"version": 7}
                if self.path == "/v1/generate":
                    answer["completions"] = [
                        [{"prompt_index": i, "sample_index": j, "prompt_token_ids": [], "token_ids": [],
                          "logprobs": [], "text": f"{p}@{outer.name}"} for j in range(body["n"])]
                        for i, p in enumerate(body["prompts"])]
                data = json.dumps(answer).encode()
                self.send_response(outer.status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def leave(self) -> None:
        """The pod is deleted: nothing listens at its address any more."""
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def rollouts() -> Iterator[list[Rollout]]:
    made = [Rollout(f"r{i}") for i in range(3)]
    yield made
    for r in made:
        try:
            r.leave()
        except OSError:
            pass


OPTS = SamplingOptions(temperature=1.0, top_p=1.0, max_tokens=4, seed=0)
PROMPTS = [f"p{i}" for i in range(6)]


def texts(groups: list[Any]) -> list[str]:
    return [g[0].text.split("@")[0] for g in groups]


def test_generate_spreads_prompts_in_order(rollouts: list[Rollout]) -> None:
    client = RolloutClient([r.address for r in rollouts], "t")
    groups, versions = client.generate(PROMPTS, OPTS, n=2)
    assert texts(groups) == PROMPTS and versions == {7} and all(len(g) == 2 for g in groups)
    assert [g[0].text.split("@")[1] for g in groups] == ["r0", "r0", "r1", "r1", "r2", "r2"]


def test_a_rollout_that_left_is_dropped_and_its_prompts_go_to_the_others(rollouts: list[Rollout]) -> None:
    client = RolloutClient([r.address for r in rollouts], "t")
    rollouts[1].leave()
    groups, versions = client.generate(PROMPTS, OPTS, n=1)
    assert texts(groups) == PROMPTS and versions == {7}  # every prompt, in order
    assert {g[0].text.split("@")[1] for g in groups[2:4]} <= {"r0", "r2"}
    assert client.addresses == [rollouts[0].address, rollouts[2].address]
    rollouts[2].leave()
    assert client.update(8) >= 0 and client.addresses == [rollouts[0].address]
    # still registered in etcd until its lease expires: join does not adopt it again
    assert client.join([r.address for r in rollouts], 8) == [] and client.addresses == [rollouts[0].address]


def test_an_error_a_rollout_answers_still_fails(rollouts: list[Rollout]) -> None:
    rollouts[0].status = 500
    client = RolloutClient([r.address for r in rollouts], "t")
    with pytest.raises(RolloutError, match="HTTP 500"):
        client.generate(PROMPTS, OPTS, n=1)


def test_losing_every_rollout_fails(rollouts: list[Rollout]) -> None:
    client = RolloutClient([r.address for r in rollouts[:2]], "t")
    rollouts[0].leave()
    rollouts[1].leave()
    with pytest.raises(RolloutError, match="every rollout sidecar is gone"):
        client.generate(PROMPTS, OPTS, n=1)


def test_a_rollout_that_joins_loads_the_current_version_before_it_generates(rollouts: list[Rollout]) -> None:
    client = RolloutClient([rollouts[0].address], "t")
    assert client.join([r.address for r in rollouts[:2]], 5) == [rollouts[1].address]  # scaled up: a newcomer
    assert rollouts[1].calls == [("/update", {"version": 5})] and rollouts[0].calls == []
    groups, _ = client.generate(PROMPTS, OPTS, n=1)
    assert texts(groups) == PROMPTS and rollouts[1].calls[1][0] == "/v1/generate"


def test_a_connection_closed_under_a_request_is_tried_again_not_taken_for_a_gone_rollout(
        rollouts: list[Rollout]) -> None:
    """A server that closes the connection without answering once (an idle keep-alive connection it closed as
    the request went out) still gets the update: were it dropped, its pod would keep the old version while
    the driver believes it loaded the new one."""
    client = RolloutClient([r.address for r in rollouts[:2]], "t")
    rollouts[1].hang_ups = 1
    client.update(9)
    assert client.addresses == [rollouts[0].address, rollouts[1].address]
    assert rollouts[1].calls == [("/update", {"version": 9}), ("/update", {"version": 9})]
    rollouts[1].hang_ups = 2  # twice in a row: gone
    client.update(10)
    assert client.addresses == [rollouts[0].address]
