"""HTTP client of the rollout sidecars, found through etcd: generate, update, start, terminate.

Role: the driver's only way to talk to vLLM — in its own pod or any other. Each rollout sidecar
advertises `{"address": "host:port", "generation": g, ...}` under `keys.endpoint(ns, job, pod,
"rollout")` (lease-bound, so a dead one disappears once its lease expires; until then
`trainer.resume` skips records of another gang generation). Caller: `tandem.sidecars.trainer.loop.driver`.
A rollout that cannot be reached any more (its pod deleted: a scale-down of the rollout-only pool)
is dropped, and its share of a generate call goes to the others, so removing rollout-only pods
never fails the iteration; an error the rollout itself answers still does, as does losing them all.
A dropped rollout that is still registered comes back through `join` (it first loads the version).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import httpx

from tandem.checkpoint_engine.models import Completion, SamplingOptions, slice_seed

log = logging.getLogger(__name__)
T = TypeVar("T")


class RolloutError(RuntimeError):
    pass


class RolloutGone(RolloutError):
    """The rollout could not be reached (connection refused or reset, timed out)."""


class RolloutClient:
    def __init__(self, addresses: Sequence[str], token: str, timeout: float = 1800.0):
        if not addresses:
            raise RolloutError("no rollout sidecar is registered in etcd")
        self.addresses = list(addresses)
        self._http = httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=timeout)

    def join(self, addresses: Sequence[str], version: int) -> list[str]:
        """Adopt the rollouts now registered: newcomers (e.g. rollout-only pods scaled up) first load
        `version`; vanished ones (their etcd lease expired) are dropped. Returns the newcomers."""
        new = [a for a in addresses if a not in self.addresses]
        gone = [a for a in new if self._reach(a, "/update", {"version": version}) is None]  # registered, dead
        alive = [a for a in addresses if a not in gone]
        if alive:
            self.addresses = alive
        return [a for a in new if a not in gone]

    def close(self) -> None:
        self._http.close()

    def _call(self, address: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        url = f"http://{address}{path}"
        for attempt in range(2):
            try:
                r = self._http.post(url, json=body or {})
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
            raise RolloutError(f"{url}: HTTP {r.status_code}: {r.text[:500]}")
        out: dict[str, Any] = r.json()
        return out

    def _reach(self, address: str, path: str, body: dict[str, Any] | None) -> dict[str, Any] | None:
        """The answer, or None when the rollout is gone."""
        try:
            return self._call(address, path, body)
        except RolloutGone as e:
            log.warning("rollout %s is unreachable, dropped from this client: %s", address, e)
            return None

    def _drop(self, gone: Sequence[str]) -> None:
        if not gone:
            return
        left = [a for a in self.addresses if a not in gone]
        if not left:
            raise RolloutError(f"every rollout sidecar is gone (last: {', '.join(gone)})")
        self.addresses = left

    def _all(self, path: str, body: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        addresses = list(self.addresses)
        with ThreadPoolExecutor(len(addresses)) as pool:
            answers = list(pool.map(lambda a: self._reach(a, path, body), addresses))
        self._drop([a for a, r in zip(addresses, answers, strict=True) if r is None])
        return [r for r in answers if r is not None]

    def generate(self, prompts: Sequence[str | list[int]], options: SamplingOptions, n: int,
                 max_tokens: Sequence[int] | None = None) -> tuple[list[list[Completion]], set[int | None]]:
        """n completions per prompt, spread over the rollouts in contiguous slices of prompts.

        `max_tokens` (one per prompt) overrides `options.max_tokens` per prompt. Also returns the
        weight versions the rollouts generated with (one, when all are in sync).
        """
        def options_at(a: int) -> dict[str, Any]:  # each slice its own seed: rollouts' first prompts draw apart
            seed = None if options.seed is None else slice_seed(options.seed, a)
            return options.model_copy(update={"seed": seed}).model_dump()

        return self._spread("/v1/generate", 0, len(prompts), lambda a, b: {
            "options": options_at(a), "n": n, "prompts": list(prompts[a:b]),
            "max_tokens": None if max_tokens is None else list(max_tokens[a:b])},
            lambda part: [[Completion.model_validate(c) for c in group] for group in part["completions"]])

    def trajectories(self, rows: Sequence[list[dict[str, Any]]], options: SamplingOptions, n: int,
                     data: Sequence[dict[str, Any]] | None = None
                     ) -> tuple[list[list[dict[str, Any]]], set[int | None]]:
        """n multi-turn trajectories per row of chat messages (the rollouts' `/v1/trajectories`), spread over
        the rollouts as `generate` spreads prompts; `data`: each row's dataset fields, for the environment.
        Also the weight versions that sampled them."""
        body = {"options": options.model_dump(), "n": n}
        return self._spread("/v1/trajectories", 0, len(rows), lambda a, b: {
            **body, "rows": list(rows[a:b]), "data": None if data is None else list(data[a:b])},
            lambda part: list(part["trajectories"]))

    def _spread(self, path: str, lo: int, hi: int, body: Callable[[int, int], dict[str, Any]],
                take: Callable[[dict[str, Any]], list[T]]) -> tuple[list[T], set[int | None]]:
        """Items lo..hi-1 in contiguous slices, one request per rollout (`body(a, b)` of its slice); the
        results in order, and the weight versions the rollouts report. A rollout that is gone is dropped
        and its slice goes to the others, in place."""
        addresses = list(self.addresses)
        k = len(addresses)
        cuts = [(lo + i * (hi - lo) // k, lo + (i + 1) * (hi - lo) // k) for i in range(k)]

        def call(address: str, cut: tuple[int, int]) -> dict[str, Any] | None:
            return self._reach(address, path, body(*cut)) if cut[1] > cut[0] else {}

        with ThreadPoolExecutor(k) as pool:
            parts = list(pool.map(call, addresses, cuts))
        self._drop([a for a, part in zip(addresses, parts, strict=True) if part is None])
        out: list[T] = []
        versions: set[int | None] = set()
        for part, (a, b) in zip(parts, cuts, strict=True):
            if part is None:  # that rollout is gone: the others take its slice
                more, seen = self._spread(path, a, b, body, take)
                out += more
                versions |= seen
            elif b > a:
                versions.add(part.get("version"))
                out += take(part)
        return out, versions

    def update(self, version: int) -> float:
        """Load `version` in every rollout; returns the slowest rollout's seconds."""
        t = time.perf_counter()
        self._all("/update", {"version": version})
        return time.perf_counter() - t

    def start(self, model_dir: str, dummy: bool = True) -> None:
        self._all("/start", {"model_dir": model_dir, "dummy": dummy})

    def terminate(self) -> None:
        self._all("/terminate")

    def sleep(self, level: int = 1) -> None:
        self._all("/sleep", {"level": level})

    def wake_up(self) -> None:
        self._all("/wake_up")
