"""Asynchronous rollouts with bounded staleness (`AsyncRollouts`) and `sources.to_samples`.

`GatedClient` has the RolloutClient methods the producer calls (generate, update, join, close);
each generate waits for a permit the test releases, so a test decides how many batches exist and
waits for conditions (the client's own Condition), never for fixed times. The one bounded wait that
expects nothing to happen (the producer must not start a batch beyond k) is a negative check.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from tandem.sidecars.rollout_engine.sampling import Completion, SamplingOptions
from tandem.sidecars.trainer.loop.data.dataset import Prompt
from tandem.sidecars.trainer.loop.rollout.async_rollouts import AsyncRollouts, Generate
from tandem.sidecars.trainer.loop.rollout.partial import Group, Pending, Segment
from tandem.sidecars.trainer.loop.rollout.sources import to_samples, trajectory_groups, turn_stats
from tandem.spec import seeds

WAIT = 10.0  # seconds a condition may take before the test fails


class GatedClient:
    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.permits = threading.Semaphore(0)
        self.loaded: int | None = None
        self.calls: list[tuple[Any, ...]] = []  # ("update", v), ("generate", seed, version), ("join", addrs, v)
        self.queued_at_start: list[int] = []  # queue length seen as each batch began
        self.producer: AsyncRollouts | None = None
        self.fail: BaseException | None = None
        self.report_version: int | None = None  # generate claims this version instead of the loaded one
        self.closed = False

    def _log(self, *call: Any) -> None:
        with self.cond:
            self.calls.append(call)
            self.cond.notify_all()

    def wait_for(self, pred: Callable[[], bool], timeout: float = WAIT) -> bool:
        with self.cond:
            return self.cond.wait_for(pred, timeout)

    def generates(self) -> list[tuple[Any, ...]]:
        return [c for c in self.calls if c[0] == "generate"]

    def update(self, version: int) -> float:
        self.loaded = version
        self._log("update", version)
        return 0.0

    def join(self, addresses: Sequence[str], version: int) -> list[str]:
        self._log("join", list(addresses), version)
        return []

    def close(self) -> None:
        self.closed = True

    def generate(self, prompts: Sequence[str | list[int]], options: SamplingOptions, n: int,
                 max_tokens: Sequence[int] | None = None, *, expect: int | None = None
                 ) -> tuple[list[list[Completion]], set[int | None]]:
        assert self.producer is not None and expect == self.loaded  # the producer asks for the version it loaded
        self.queued_at_start.append(len(self.producer._queue))
        self._log("generate", options.seed, self.loaded)
        assert self.permits.acquire(timeout=WAIT), "the test released no permit"
        if self.fail is not None:
            raise self.fail
        groups = [[Completion(prompt_index=i, sample_index=j, prompt_token_ids=[1], token_ids=[7] * (1 + j),
                              logprobs=[-1.0] * (1 + j), text="x", finish_reason="stop") for j in range(n)]
                  for i in range(len(prompts))]
        return groups, {self.loaded if self.report_version is None else self.report_version}

    def trajectories(self, rows: Sequence[list[dict[str, Any]]], options: SamplingOptions, n: int,
                     data: Sequence[dict[str, Any]] | None = None, *, expect: int | None = None
                     ) -> tuple[list[list[dict[str, Any]]], set[int | None]]:
        """Two-turn trajectories as the rollouts' /v1/trajectories returns them: a model turn (3 tokens), a tool
        message (2, masked out), a model turn (1)."""
        assert self.producer is not None
        self._log("generate", options.seed, self.loaded)
        assert self.permits.acquire(timeout=WAIT), "the test released no permit"
        out = [[{"prompt_ids": [1], "completion_ids": [7, 7, 7, 5, 5, 8],
                 "logprobs": [-1.0, -1.0, -1.0, 0.0, 0.0, -2.0], "mask": [1, 1, 1, 0, 0, 1],
                 "text": f"{row[-1]['content']} {(data or [{}])[i].get('answer')}",
                 "finish": "stop", "turns": 2, "tool_calls": 1, "tool_errors": 0, "tool_seconds": 0.5,
                 "tool_results": 1, "reward": None}
                for _ in range(n)] for i, row in enumerate(rows)]
        return out, {self.loaded}


def queued(producer: AsyncRollouts, n: int) -> bool:
    """Wait until `n` batches wait in the producer's queue (it notifies its condition on each)."""
    with producer._cond:
        return producer._cond.wait_for(lambda: len(producer._queue) == n, WAIT)


def prompts_of(batch: int) -> list[Prompt]:
    return [Prompt(text=f"b{batch}p{i}", answer=str(batch), index=2 * batch + i,
                   messages=[{"role": "user", "content": f"b{batch}p{i}"}]) for i in range(2)]


@pytest.fixture
def make() -> Iterator[Callable[..., tuple[AsyncRollouts, GatedClient]]]:
    made: list[tuple[AsyncRollouts, GatedClient]] = []

    def build(k: int, version: int = 0, first_batch: int = 0, generate: Generate | None = None,
              seed: int = 0) -> tuple[AsyncRollouts, GatedClient]:
        client = GatedClient()
        producer = AsyncRollouts(client, prompts_of, SamplingOptions(max_tokens=8),  # type: ignore[arg-type]
                                 group_size=2, max_staleness=k, first_batch=first_batch, version=version,
                                 generate=generate, seed=seed)
        client.producer = producer
        made.append((producer, client))
        return producer.start(), client

    yield build
    for producer, client in made:
        client.permits.release(100)
        producer.close()


def test_the_producer_never_queues_more_than_k_batches(make: Any) -> None:
    producer, client = make(2)
    client.permits.release(10)
    assert queued(producer, 2)
    # room for no third batch: it must not start (a bounded wait expecting nothing)
    assert not client.wait_for(lambda: len(client.generates()) > 2, timeout=0.3)
    taken = producer.take(0)
    assert taken.batch.index == 0 and taken.dropped == []
    assert client.wait_for(lambda: len(client.generates()) == 3)  # one taken: one more may start
    assert all(n < 2 for n in client.queued_at_start)


def test_batches_come_in_order_and_next_batch_advances(make: Any) -> None:
    producer, client = make(3, first_batch=5)
    assert producer.next_batch() == 5
    client.permits.release(3)
    for i in range(5, 8):
        t = producer.take(0)
        assert t.batch.index == i and t.batch.version == 0 and t.dropped == []
        assert [g.prompt.index for g in t.batch.groups] == [p.index for p in prompts_of(i)]
        assert all(len(g.members) == 2 and g.done for g in t.batch.groups)
        assert all(m.segments == [Segment(0, len(m.token_ids))] for g in t.batch.groups for m in g.members)
        assert producer.next_batch() == i + 1
    assert [c[1] for c in client.generates()[:3]] == [5, 6, 7]  # the batch index seeds its sampling


def test_the_jobs_seed_and_the_batch_index_seed_its_sampling(make: Any) -> None:
    producer, client = make(2, first_batch=5, seed=3)
    client.permits.release(2)
    assert queued(producer, 2)
    assert [c[1] for c in client.generates()[:2]] == [seeds.request_seed(3, 5), seeds.request_seed(3, 6)]
    assert seeds.request_seed(3, 5) not in (5, 6)  # another job seed, other samples


def test_the_newest_published_version_is_loaded_before_a_batch(make: Any) -> None:
    producer, client = make(2, version=3)
    assert client.wait_for(lambda: len(client.generates()) == 1)
    producer.published(4)  # while batch 0 generates: it stays a version-3 batch
    producer.published(2)  # an older announcement changes nothing
    client.permits.release(2)
    assert client.wait_for(lambda: len(client.generates()) == 2)
    assert client.calls[:4] == [("update", 3), ("generate", 0, 3), ("update", 4), ("generate", 1, 4)]
    first, second = producer.take(4), producer.take(4)
    assert (first.batch.version, second.batch.version) == (3, 4)


def test_a_multi_turn_producer_batches_whole_trajectories_of_one_version(make: Any) -> None:
    """maxStaleness with rollout.environment: each batch is trajectories of the version loaded before it, the
    environment's tokens masked out, the turn counts kept for the iteration's metrics."""
    producer, client = make(1, version=3, generate=trajectory_groups(2))
    client.permits.release(1)
    taken = producer.take(4)
    assert taken.batch.version == 3 and client.generates() == [("generate", 0, 3)]
    member = taken.batch.groups[1].members[0]
    assert member.mask == [1, 1, 1, 0, 0, 1] and [s.version for s in member.segments] == [3]
    assert member.text == "b0p1 0"  # the prompt's own conversation and fields reached the environment
    assert len(taken.batch.groups) == 2 and all(len(g.members) == 2 for g in taken.batch.groups)
    assert turn_stats(taken.batch.groups) == {"turns_mean": 2.0, "tool_calls_mean": 1.0, "tool_results_mean": 1.0,
                                              "tool_error_frac": 0.0, "tool_seconds": 2.0}
    samples, _ = to_samples(taken.batch.groups, eos_id=2, decode=lambda ids: "")
    assert samples[0].completion_ids == [7, 7, 7, 5, 5, 8] and samples[0].completion_mask == [1, 1, 1, 0, 0, 1]


def test_take_drops_batches_more_than_k_versions_old(make: Any) -> None:
    producer, client = make(1)
    client.permits.release(1)
    assert queued(producer, 1)
    producer.published(1)
    producer.published(2)
    client.permits.release(1)
    taken = producer.take(2)  # batch 0 (version 0) is 2 versions old: beyond k = 1
    assert [d.index for d in taken.dropped] == [0] and [d.version for d in taken.dropped] == [0]
    assert (taken.batch.index, taken.batch.version) == (1, 2)
    assert producer.next_batch() == 2
    assert ("update", 2) in client.calls


def test_a_batch_exactly_k_versions_old_is_kept(make: Any) -> None:
    producer, client = make(2)
    client.permits.release(1)
    taken = producer.take(2)
    assert taken.batch.version == 0 and taken.dropped == []


def test_new_rollout_addresses_are_joined_with_the_loaded_version(make: Any) -> None:
    producer, client = make(2, version=1)
    assert client.wait_for(lambda: len(client.generates()) == 1)
    producer.rollouts_now(["10.0.0.9:8000"])
    client.permits.release(2)
    assert client.wait_for(lambda: len(client.generates()) == 2)
    assert ("join", ["10.0.0.9:8000"], 1) in client.calls


def test_a_failing_producer_surfaces_from_take(make: Any) -> None:
    producer, client = make(2)
    client.fail = ValueError("rollout pod exploded")
    client.permits.release(1)
    with pytest.raises(RuntimeError, match="rollout pod exploded"):
        producer.take(0, timeout=WAIT)


def test_a_batch_of_another_version_is_an_error(make: Any) -> None:
    producer, client = make(2, version=5)
    client.report_version = 4
    client.permits.release(1)
    with pytest.raises(RuntimeError, match="expected 5"):
        producer.take(5, timeout=WAIT)


def test_exclusive_waits_for_the_batch_in_flight_then_loads_the_version(make: Any) -> None:
    """Shared rollouts: the driver's evaluation never runs inside a batch, and finds its version."""
    producer, client = make(2, version=0)
    assert client.wait_for(lambda: len(client.generates()) == 1)  # batch 0 generating (no permit yet)
    producer.published(1)
    inside = threading.Event()

    def evaluate() -> None:
        with producer.exclusive(1):
            client._log("eval", client.loaded)
            inside.set()

    t = threading.Thread(target=evaluate)
    t.start()
    with producer._cond:
        assert producer._cond.wait_for(lambda: producer._waiting == 1, WAIT)
    assert not inside.is_set()  # batch 0 still holds the rollouts
    client.permits.release(1)
    assert inside.wait(WAIT)
    t.join(WAIT)
    client.permits.release(1)
    assert client.wait_for(lambda: len(client.generates()) == 2)
    # batch 0 under version 0; the evaluation loads 1; batch 1 finds it loaded and does not reload
    assert client.calls[:5] == [("update", 0), ("generate", 0, 0), ("update", 1), ("eval", 1), ("generate", 1, 1)]
    assert [producer.take(1).batch.version for _ in range(2)] == [0, 1]


def test_take_times_out_without_a_batch(make: Any) -> None:
    producer, _ = make(1)
    with pytest.raises(TimeoutError):
        producer.take(0, timeout=0.05)


def test_close_stops_the_thread(make: Any) -> None:
    producer, client = make(1)
    client.permits.release(1)
    assert queued(producer, 1)  # the producer waits for room
    producer.close()
    assert not producer._thread.is_alive()


def test_max_staleness_zero_is_refused() -> None:
    with pytest.raises(ValueError, match="max_staleness"):
        AsyncRollouts(GatedClient(), prompts_of, SamplingOptions(), group_size=2,  # type: ignore[arg-type]
                      max_staleness=0, first_batch=0, version=0)


# ---- sources.to_samples --------------------------------------------------------------------------


def pending(tokens: list[int], logprobs: list[float], segments: list[tuple[int, int]], text: str = "vllm") -> Pending:
    return Pending(prompt_ids=[1, 2], token_ids=tokens, logprobs=logprobs,
                   segments=[Segment(v, n) for v, n in segments], text=text, finish_reason="stop", done=True)


def group(index: int, *members: Pending) -> Group:
    return Group(Prompt(text=f"t{index}", answer=str(index), index=index, question=f"q{index}"), list(members), born=0)


class Decoder:
    def __init__(self) -> None:
        self.seen: list[list[int]] = []

    def __call__(self, ids: list[int]) -> str:
        self.seen.append(list(ids))
        return "decoded:" + ",".join(map(str, ids))


def test_to_samples_decodes_multi_segment_completions_and_keeps_vllm_text() -> None:
    decode = Decoder()
    groups = [group(0, pending([5, 6], [-0.5, -0.6], [(0, 2)], text="single"),
                    pending([7, 8, 9], [-0.1, -0.2, -0.3], [(0, 2), (1, 1)], text="")),
              group(1, pending([4], [-0.4], [(1, 1)], text="other"), pending([3], [-0.3], [(1, 1)], text="x"))]
    samples, inputs = to_samples(groups, eos_id=99, decode=decode)
    assert decode.seen == [[7, 8, 9]]
    assert [i.completion for i in inputs] == ["single", "decoded:7,8,9", "other", "x"]
    assert [(i.prompt, i.answer) for i in inputs] == [("q0", "0"), ("q0", "0"), ("q1", "1"), ("q1", "1")]
    assert [s.group for s in samples] == [0, 0, 1, 1]
    assert [s.completion_ids for s in samples] == [[5, 6], [7, 8, 9], [4], [3]]
    assert samples[1].rollout_logprobs == [-0.1, -0.2, -0.3] and samples[0].prompt_ids == [1, 2]


@pytest.mark.parametrize("bad", ["nan", "missing", "empty"])
def test_one_unusable_logprob_drops_every_samples_rollout_logprobs(bad: str) -> None:
    odd = {"nan": pending([5, 6], [-0.5, math.nan], [(0, 2)]),
           "missing": pending([5, 6], [], [(0, 2)]),
           "empty": pending([], [], [(0, 0)])}[bad]
    samples, _ = to_samples([group(0, pending([1], [-1.0], [(0, 1)]), odd)], eos_id=99, decode=Decoder())
    assert [s.rollout_logprobs for s in samples] == [None, None]
    if bad == "empty":
        assert samples[1].completion_ids == [99]  # an empty completion trains as EOS


def test_to_samples_keeps_logprobs_when_all_are_usable() -> None:
    samples, _ = to_samples([group(0, pending([1], [-1.0], [(0, 1)]), pending([2, 3], [-2.0, -3.0], [(0, 2)]))],
                            eos_id=99, decode=Decoder())
    assert [s.rollout_logprobs for s in samples] == [[-1.0], [-2.0, -3.0]]
