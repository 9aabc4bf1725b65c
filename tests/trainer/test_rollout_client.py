"""RolloutClient when rollouts leave (a scale-down of the rollout-only pool), fail (5xx: engine not running),
hang (no progress on /health), or answer at an old version: they are dropped and their prompts go to the
others, in place; a dropped rollout comes back only once it loaded the current version; an error in the
request (4xx) still fails; with none left the client waits for one, up to its bound, then fails in one line.
Real HTTP servers on loopback stand for the rollout sidecars' API (/v1/generate, /update, /health); the
sidecars themselves, with real vLLM engines killed and stopped, are in tests/e2e/test_rollout_faults.py."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from http_stand_in import JsonHandler, serve
from tandem.sidecars.rollout_engine.sampling import SamplingOptions
from tandem.sidecars.trainer.loop.rollout.rollout_client import RolloutClient, RolloutError


class Rollout:
    """A fake rollout sidecar: each completion's text names the prompt and who generated it."""

    def __init__(self, name: str, status: int = 200):
        self.name, self.status, self.calls = name, status, []  # type: ignore[var-annotated]
        self.hang_ups = 0  # requests answered by closing the connection (a keep-alive closed as one arrives)
        self.version = 7
        self.hold = threading.Event()  # set: requests wait until it is cleared
        self.stalled = 0.0  # what /health reports as stalledS
        self.health_answers = True  # False: /health does not answer (the whole sidecar stopped)
        outer = self

        class Handler(JsonHandler):
            def do_GET(self) -> None:  # noqa: N802
                while not outer.health_answers:
                    time.sleep(0.05)
                self.answer({"ok": True, "stalledS": outer.stalled})

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.calls.append((self.path, body))
                while outer.hold.is_set():
                    time.sleep(0.05)
                if outer.hang_ups:
                    outer.hang_ups -= 1
                    self.close_connection = True
                    return
                if self.path == "/update" and outer.status == 200:
                    outer.version = body["version"]
                answer: dict[str, Any] = {"version": outer.version}
                if self.path == "/v1/generate":
                    answer["completions"] = [
                        [{"prompt_index": i, "sample_index": j, "prompt_token_ids": [], "token_ids": [],
                          "logprobs": [], "text": f"{p}@{outer.name}"} for j in range(body["n"])]
                        for i, p in enumerate(body["prompts"])]
                self.answer(answer, outer.status)

        self.server, self.address = serve(Handler)

    def leave(self) -> None:
        """The pod is deleted: nothing listens at its address any more."""
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def rollouts() -> Iterator[list[Rollout]]:
    made = [Rollout(f"r{i}") for i in range(3)]
    yield made
    for r in made:
        r.hold.clear()
        r.health_answers = True
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


def test_an_error_in_the_request_still_fails(rollouts: list[Rollout]) -> None:
    rollouts[0].status = 400  # e.g. prompt_too_long: every rollout would answer the same
    client = RolloutClient([r.address for r in rollouts], "t")
    with pytest.raises(RolloutError, match="HTTP 400"):
        client.generate(PROMPTS, OPTS, n=1)


def test_a_rollout_whose_engine_failed_is_dropped_and_its_prompts_resent(rollouts: list[Rollout]) -> None:
    rollouts[1].status = 503  # engine_not_running: its vLLM died mid-generate
    client = RolloutClient([r.address for r in rollouts], "t")
    groups, versions = client.generate(PROMPTS, OPTS, n=1, expect=7)
    assert texts(groups) == PROMPTS and versions == {7}
    assert client.addresses == [rollouts[0].address, rollouts[2].address]
    faults = client.faults.take()
    assert faults["rollouts_dropped"] == 1 and faults["prompts_resent"] == 2
    assert "HTTP 503" in faults["rollout_faults"][0]
    assert client.faults.take()["rollouts_dropped"] == 0  # counted once


def test_a_failed_update_drops_that_rollout_until_it_loads_the_version(rollouts: list[Rollout]) -> None:
    client = RolloutClient([r.address for r in rollouts], "t")
    rollouts[2].status = 503
    client.update(8)  # the iteration goes on with the others
    assert client.addresses == [rollouts[0].address, rollouts[1].address] and client.expected == 8
    assert client.join([r.address for r in rollouts], 8) == [] and rollouts[2].address not in client.addresses
    rollouts[2].status = 200  # its engine restarted: it loads version 8 before it serves
    assert client.join([r.address for r in rollouts], 8) == [rollouts[2].address]
    assert rollouts[2].calls[-1] == ("/update", {"version": 8}) and client.faults.take()["rollouts_rejoined"] == 1
    groups, versions = client.generate(PROMPTS, OPTS, n=1, expect=8)
    assert versions == {8} and texts(groups) == PROMPTS


def test_a_rollout_at_an_old_version_never_serves_the_batch(rollouts: list[Rollout]) -> None:
    client = RolloutClient([r.address for r in rollouts], "t")
    client.update(8)
    rollouts[0].version = 7  # it came back at an old version (a reload that fell back)
    groups, versions = client.generate(PROMPTS, OPTS, n=1, expect=8)
    assert versions == {8} and all(not g[0].text.endswith("@r0") for g in groups) and texts(groups) == PROMPTS
    assert client.addresses == [rollouts[1].address, rollouts[2].address]
    assert "version 7, not 8" in client.faults.take()["rollout_faults"][0]


@pytest.mark.parametrize("how", ["engine hung", "sidecar stopped"])
def test_a_hung_rollout_is_dropped_after_the_stall_limit(rollouts: list[Rollout], how: str) -> None:
    """Its request stays open; /health says its engine has made no progress (or does not answer): the
    client stops waiting after stall_s, not after the HTTP timeout, and the others take its prompts."""
    client = RolloutClient([r.address for r in rollouts], "t", stall_s=1.0)
    rollouts[1].hold.set()
    if how == "engine hung":
        rollouts[1].stalled = 5.0
    else:
        rollouts[1].health_answers = False
    t = time.monotonic()
    groups, _ = client.generate(PROMPTS, OPTS, n=1)
    assert time.monotonic() - t < 60 and texts(groups) == PROMPTS
    assert client.addresses == [rollouts[0].address, rollouts[2].address]
    assert "RolloutHung" not in client.faults.causes[0] and ("no progress" in client.faults.causes[0]
                                                            or "has not answered" in client.faults.causes[0])


def test_a_slow_rollout_that_makes_progress_is_waited_for(rollouts: list[Rollout]) -> None:
    """A long generation whose engine keeps stepping (stalledS stays low) is never cut."""
    client = RolloutClient([r.address for r in rollouts], "t", stall_s=1.0)
    rollouts[1].hold.set()
    threading.Timer(3.0, rollouts[1].hold.clear).start()  # three stall limits of work, with progress
    groups, _ = client.generate(PROMPTS, OPTS, n=1)
    assert [g[0].text.split("@")[1] for g in groups][2:4] == ["r1", "r1"]
    assert len(client.addresses) == 3 and client.faults.take()["rollouts_dropped"] == 0


def test_with_no_healthy_rollout_the_client_waits_for_one_then_goes_on(rollouts: list[Rollout]) -> None:
    waits: list[str] = []
    registered = {rollouts[0].address: "job-0", rollouts[1].address: "job-1"}
    client = RolloutClient(list(registered), "t", discover=lambda: dict(registered), on_wait=waits.append,
                           unavailable_s=120)
    client.names.update(registered)
    client.update(8)
    for r in rollouts[:2]:
        r.status = 503
    threading.Timer(3.0, lambda: setattr(rollouts[1], "status", 200)).start()  # its engine is back
    groups, versions = client.generate(PROMPTS, OPTS, n=1, expect=8)
    assert texts(groups) == PROMPTS and versions == {8} and client.addresses == [rollouts[1].address]
    assert waits and "no healthy rollout" in waits[0] and "pod job-0" in waits[0]
    paths = [path for path, _ in rollouts[1].calls]
    last_update = max(i for i, p in enumerate(paths) if p == "/update")
    assert rollouts[1].calls[last_update][1] == {"version": 8} and set(paths[last_update + 1:]) == {"/v1/generate"}
    assert client.faults.take()["rollouts_unavailable_s"] > 0


def test_losing_every_rollout_fails_after_the_bound_in_one_line(rollouts: list[Rollout]) -> None:
    client = RolloutClient([r.address for r in rollouts[:2]], "t", unavailable_s=0, discover=dict)
    rollouts[0].leave()
    rollouts[1].leave()
    with pytest.raises(RolloutError, match="no healthy rollout .* none came back within 0s") as e:
        client.generate(PROMPTS, OPTS, n=1)
    assert "\n" not in str(e.value)


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
