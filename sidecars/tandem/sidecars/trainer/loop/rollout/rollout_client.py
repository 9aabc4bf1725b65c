"""HTTP client of the rollout sidecars, found through etcd: generate, update, start, terminate.

Role: the driver's only way to talk to vLLM — in its own pod or any other. Each rollout sidecar
advertises `{"address": "host:port", "generation": g, "ready": ..., ...}` under `keys.endpoint(ns, job,
pod, "rollout")` (lease-bound, so a dead one disappears once its lease expires). Caller:
`tandem.sidecars.trainer.loop.driver` (and the sources and evaluation it hands the client to).

Rollouts are a pool (`rollout_health` says what counts as unhealthy): a rollout that is gone (connection
refused, reset), hung (no progress: `watch.watched`), answers that its engine is not running (5xx, 409),
fails to load a version, or answers with a version other than the one asked for, is dropped from the client
and the prompts it had not finished go, in place, to the others (each slice with its own seed). A dropped
rollout that is registered and ready again is re-admitted by `join` once it has loaded the version the
driver trains (a stale rollout never serves unknowingly). An error in what was asked (4xx: a prompt too long,
an unknown version) still fails the call. With no healthy rollout left, `recover` waits for one
(failurePolicy.rolloutUnavailableSeconds, saying why through `on_wait`), then fails with one line naming
each rollout and what happened to it. Every generation answer carries its engine's restarts and latest
recovery (seconds from a failure found to its first generation after the restart): `FaultCounts.seen` turns them
into the iteration's `rollout_restarts` and `rollout_recovery_s`. Requests are built, and generation answers read,
with the rollout's own models (`tandem.sidecars.rollout_engine.contract`), the ones its server parses.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel

from tandem.sidecars.rollout_engine.contract import (
    Completion,
    GenerateRequest,
    GenerateResponse,
    SamplingOptions,
    SleepRequest,
    StartRequest,
    TrajectoriesRequest,
    TrajectoriesResponse,
    UpdateRequest,
    encode_image,
)
from tandem.sidecars.rollout_engine.sampling import slice_seed
from tandem.sidecars.trainer.loop.rollout.rollout_health import (
    RolloutError,
    RolloutGone,
    RolloutStale,
    RolloutUnhealthy,
    Watch,
    classify,
)
from tandem.spec.progress import WAITING_FOR_ROLLOUTS

log = logging.getLogger(__name__)
T = TypeVar("T")
__all__ = ["FaultCounts", "RolloutClient", "RolloutError", "RolloutGone", "RolloutStale", "RolloutUnhealthy"]


@dataclass
class FaultCounts:
    """What the pool went through since the last `take` (the iteration's metrics), and the engine restarts its
    rollouts reported so far (`rollout_restarts`, over every rollout this client heard from)."""

    dropped: int = 0  # rollouts dropped (gone, hung, failed, stale)
    resent: int = 0  # prompts (or rows) re-sent to other rollouts
    rejoined: int = 0  # dropped rollouts admitted again at the current version
    waited_s: float = 0.0  # seconds spent with no healthy rollout
    recovery_s: float | None = None  # the longest engine recovery a rollout completed (failure to generation)
    causes: list[str] = field(default_factory=list)
    engines: dict[str, tuple[int, int]] = field(default_factory=dict)  # address -> (restarts, recoveries) seen
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def seen(self, address: str, answer: dict[str, Any]) -> None:
        """A generation answer's engine figures (`restarts`, `recoveries`, `recovery_s`): a recovery completed
        since the previous answer of that rollout counts in this iteration. The first answer of a rollout is
        its baseline (a recovery before this driver knew it is not this iteration's)."""
        restarts, recoveries = answer.get("restarts"), answer.get("recoveries")
        if not isinstance(restarts, int) or not isinstance(recoveries, int):
            return  # a rollout that does not report them
        with self._lock:
            before = self.engines.get(address)
            self.engines[address] = (restarts, recoveries)
            seconds = answer.get("recovery_s")
            if before is not None and recoveries > before[1] and isinstance(seconds, int | float):
                self.recovery_s = max(self.recovery_s or 0.0, float(seconds))

    def take(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rollouts_dropped": self.dropped, "prompts_resent": self.resent,
                               "rollouts_rejoined": self.rejoined, "rollouts_unavailable_s": round(self.waited_s, 3),
                               "rollout_restarts": sum(r for r, _ in self.engines.values())}
        if self.recovery_s is not None:
            out["rollout_recovery_s"] = round(self.recovery_s, 3)
        if self.causes:
            out["rollout_faults"] = list(self.causes[-8:])
        self.dropped = self.resent = self.rejoined = 0
        self.waited_s = 0.0
        self.recovery_s = None
        self.causes.clear()
        return out


class RolloutClient:
    def __init__(self, addresses: Sequence[str], token: str, *, stall_s: float = 120.0,
                 unavailable_s: float = 600.0, discover: Callable[[], dict[str, str]] | None = None,
                 on_wait: Callable[[str], None] | None = None, timeout: float = 1800.0):
        """`discover()`: the rollouts registered and ready now, {address: pod name}; `on_wait(reason)` is
        called while no rollout is healthy (the driver writes it into the job's status)."""
        if not addresses:
            raise RolloutError("no rollout sidecar is registered in etcd")
        self.addresses = list(addresses)
        self.token, self.stall_s, self.unavailable_s = token, stall_s, unavailable_s
        self.discover, self.on_wait = discover, on_wait
        self.names: dict[str, str] = {}  # address -> pod, for messages
        self.expected: int | None = None  # the version every rollout of the pool serves (update, join)
        self.faults = FaultCounts()
        self._dropped: set[str] = set()  # dropped and not admitted again yet
        self._http = httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=timeout)
        self._watch = Watch(stall_s)

    def like(self, addresses: Sequence[str], discover: Callable[[], dict[str, str]] | None) -> RolloutClient:
        """Another client of the same job with the same limits (the asynchronous producer's)."""
        return RolloutClient(addresses, self.token, stall_s=self.stall_s, unavailable_s=self.unavailable_s,
                             discover=discover, on_wait=self.on_wait)

    def name(self, address: str) -> str:
        pod = self.names.get(address)
        return f"pod {pod} ({address})" if pod else f"rollout {address}"

    def close(self) -> None:
        self._watch.close()
        self._http.close()

    # ---- membership ------------------------------------------------------------------------
    def join(self, addresses: Sequence[str] | dict[str, str], version: int) -> list[str]:
        """Adopt the rollouts registered and ready now: newcomers (rollout-only pods scaled up, a rollout
        back from an engine restart) first load `version` and are admitted only if that works; vanished
        ones (their lease expired, or not ready) are dropped. Returns the newcomers admitted."""
        if isinstance(addresses, dict):
            self.names.update(addresses)
        registered = list(addresses)
        new = [a for a in registered if a not in self.addresses]
        failed = [a for a in new if self._reach(a, "/update", UpdateRequest(version=version)) is None]
        admitted = [a for a in new if a not in failed]
        alive = [a for a in registered if a not in failed]
        if alive:
            self.addresses = alive
        back = [a for a in admitted if a in self._dropped]
        if back:
            log.warning("admitted again at version %d: %s", version, ", ".join(map(self.name, back)))
        self.faults.rejoined += len(back)
        self._dropped -= set(admitted)
        self.expected = version
        return admitted

    def _drop(self, dropped: Sequence[tuple[str, BaseException]]) -> None:
        if not dropped:
            return
        for address, cause in dropped:
            log.warning("%s dropped from the pool: %s", self.name(address), cause)
            self.faults.dropped += 1
            self.faults.causes.append(f"{self.name(address)}: {cause}")
            self._dropped.add(address)
        gone = {a for a, _ in dropped}
        left = [a for a in self.addresses if a not in gone]
        self.addresses = left or self._recover([f"{self.name(a)}: {str(c)[:160]}" for a, c in dropped])

    def _recover(self, why: list[str]) -> list[str]:
        """No healthy rollout: wait for one to be registered, ready and loaded with the expected version,
        up to unavailable_s; then fail with one line."""
        t = time.monotonic()
        deadline = t + self.unavailable_s
        reason = f"no healthy rollout ({'; '.join(why)})"
        while True:
            found = self.discover() if self.discover is not None else {}
            self.names.update(found)
            if self.expected is not None:
                up = [a for a in found if self._reach(a, "/update", UpdateRequest(version=self.expected)) is not None]
            else:
                up = list(found)
            if up:
                self._dropped -= set(up)
                self.faults.waited_s += time.monotonic() - t
                self.faults.rejoined += len(up)
                log.warning("rollouts back after %.0fs: %s", time.monotonic() - t, ", ".join(map(self.name, up)))
                return up
            if time.monotonic() >= deadline:
                raise RolloutError(f"{reason}; none came back within {self.unavailable_s:.0f}s "
                                   "(failurePolicy.rolloutUnavailableSeconds)")
            if self.on_wait is not None:
                self.on_wait(f"{WAITING_FOR_ROLLOUTS} ({time.monotonic() - t:.0f}s of "
                             f"{self.unavailable_s:.0f}s): {reason}")
            time.sleep(min(2.0, max(0.1, deadline - time.monotonic())))

    # ---- calls -----------------------------------------------------------------------------
    def _call(self, address: str, path: str, body: BaseModel | None = None) -> dict[str, Any]:
        """POST `body` (a contract model; none: {}), watched for progress; a typed error (rollout_health) for
        anything but an answer."""
        url = f"http://{address}{path}"
        sent = {} if body is None else body.model_dump(mode="json")
        for attempt in range(2):
            try:
                r = self._watch.watched(address, lambda: self._http.post(url, json=sent))
                break
            except httpx.TimeoutException as e:  # the rollout may still be working: not tried again
                raise RolloutGone(f"{url}: {e!r}") from e
            except httpx.TransportError as e:
                # a pooled keep-alive connection the server closed as the request went out ("Server
                # disconnected without sending a response"), or a reset: once more on a fresh connection
                # before the rollout counts as gone (a gone one is dropped, and its pod misses the update)
                if attempt:
                    raise RolloutGone(f"{url}: {e!r}") from e
                log.info("%s: %r; trying once more", url, e)
                time.sleep(0.2)
            except httpx.HTTPError as e:
                raise RolloutError(f"{url}: {e}") from e
        if r.status_code >= 400:
            raise classify(url, path, r.status_code, r.text[:500])
        out: dict[str, Any] = r.json()
        return out

    def _reach(self, address: str, path: str, body: BaseModel | None) -> dict[str, Any] | None:
        """The answer, or None when the rollout is unhealthy (logged)."""
        try:
            return self._call(address, path, body)
        except RolloutUnhealthy as e:
            log.warning("%s: %s", self.name(address), e)
            return None

    def _all(self, path: str, body: BaseModel | None = None) -> list[dict[str, Any]]:
        addresses = list(self.addresses)
        failures: dict[str, BaseException] = {}

        def one(a: str) -> dict[str, Any] | None:
            try:
                return self._call(a, path, body)
            except RolloutUnhealthy as e:
                failures[a] = e
                return None

        with ThreadPoolExecutor(len(addresses)) as pool:
            answers = list(pool.map(one, addresses))
        self._drop([(a, failures[a]) for a in addresses if a in failures])
        return [r for r in answers if r is not None]

    def generate(self, prompts: Sequence[str | list[int]], options: SamplingOptions, n: int,
                 max_tokens: Sequence[int] | None = None, *, expect: int | None = None,
                 images: Sequence[Sequence[Any]] | None = None) -> tuple[list[list[Completion]], set[int | None]]:
        """n completions per prompt, spread over the rollouts in contiguous slices of prompts.

        `max_tokens` (one per prompt) overrides `options.max_tokens` per prompt; `expect`: the version the
        completions must come from (a rollout answering with another is stale: dropped, its slice re-sent);
        `images` (one list per prompt, PIL images): each prompt's pictures, sent with its slice.
        Also returns the weight versions the rollouts generated with (one, when all are in sync).
        """
        wire = None if images is None else [[encode_image(i) for i in row] for row in images]
        def options_at(a: int) -> SamplingOptions:  # each slice its own seed: rollouts' first prompts draw apart
            seed = None if options.seed is None else slice_seed(options.seed, a)
            return options.model_copy(update={"seed": seed})

        return self._spread("/v1/generate", 0, len(prompts), lambda a, b: GenerateRequest(
            options=options_at(a), n=n, prompts=list(prompts[a:b]),
            max_tokens=None if max_tokens is None else list(max_tokens[a:b]),
            images=None if wire is None else wire[a:b]),
            lambda part: GenerateResponse.model_validate(part).completions, expect)

    def trajectories(self, rows: Sequence[list[dict[str, Any]]], options: SamplingOptions, n: int,
                     data: Sequence[dict[str, Any]] | None = None, *, expect: int | None = None,
                     images: Sequence[Sequence[Any]] | None = None
                     ) -> tuple[list[list[dict[str, Any]]], set[int | None]]:
        """n multi-turn trajectories per row of chat messages (the rollouts' `/v1/trajectories`), spread over
        the rollouts as `generate` spreads prompts; `data`: each row's dataset fields, for the environment;
        `images` (one list per row, PIL images): each row's pictures. Also the weight versions that sampled
        them."""
        wire = None if images is None else [[encode_image(i) for i in row] for row in images]
        return self._spread("/v1/trajectories", 0, len(rows), lambda a, b: TrajectoriesRequest(
            options=options, n=n, rows=list(rows[a:b]), data=None if data is None else list(data[a:b]),
            images=None if wire is None else wire[a:b]),
            lambda part: [[t.model_dump() for t in row]
                          for row in TrajectoriesResponse.model_validate(part).trajectories], expect)

    def _spread(self, path: str, lo: int, hi: int, body: Callable[[int, int], BaseModel],
                take: Callable[[dict[str, Any]], list[T]], expect: int | None) -> tuple[list[T], set[int | None]]:
        """Items lo..hi-1 in contiguous slices, one request per rollout (`body(a, b)` of its slice); the
        results in order, and the weight versions the rollouts report. A rollout that is unhealthy or stale
        is dropped and its slice goes to the others, in place."""
        addresses = list(self.addresses)
        k = len(addresses)
        cuts = [(lo + i * (hi - lo) // k, lo + (i + 1) * (hi - lo) // k) for i in range(k)]
        failures: dict[str, BaseException] = {}

        def call(address: str, cut: tuple[int, int]) -> dict[str, Any] | None:
            if cut[1] <= cut[0]:
                return {}
            try:
                part = self._call(address, path, body(*cut))
            except RolloutUnhealthy as e:
                failures[address] = e
                return None
            self.faults.seen(address, part)
            got = part.get("version")
            if expect is not None and got is not None and got != expect:
                failures[address] = RolloutStale(f"answered with version {got}, not {expect}")
                return None
            return part

        with ThreadPoolExecutor(k) as pool:
            parts = list(pool.map(call, addresses, cuts))
        self._drop([(a, failures[a]) for a in addresses if a in failures])
        out: list[T] = []
        versions: set[int | None] = set()
        for part, (a, b) in zip(parts, cuts, strict=True):
            if part is None:  # that rollout is out: the others take its slice
                self.faults.resent += b - a
                more, seen = self._spread(path, a, b, body, take, expect)
                out += more
                versions |= seen
            elif b > a:
                versions.add(part.get("version"))
                out += take(part)
        return out, versions

    def update(self, version: int) -> float:
        """Load `version` in every rollout (one that fails is dropped until it catches up: `join`);
        returns the slowest rollout's seconds."""
        t = time.perf_counter()
        self._all("/update", UpdateRequest(version=version))
        self.expected = version
        return time.perf_counter() - t

    def start(self, model_dir: str, dummy: bool = True) -> None:
        self._all("/start", StartRequest(model_dir=model_dir, dummy=dummy))

    def terminate(self) -> None:
        self._all("/terminate")

    def sleep(self, level: int = 1) -> None:
        self._all("/sleep", SleepRequest(level=level))

    def wake_up(self) -> None:
        self._all("/wake_up")
