"""HTTP client of the rollout sidecars, found through etcd: generate, update, start, terminate.

Role: the driver's only way to talk to vLLM — in its own pod or any other. Each rollout sidecar
advertises `{"address": "host:port", "generation": g, ...}` under `keys.endpoint(ns, job, pod,
"rollout")` (lease-bound, so a dead one disappears once its lease expires; until then
`trainer.resume` skips records of another gang generation). Caller: `tandem.sidecars.trainer.driver`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from tandem.checkpoint_engine.models import Completion, SamplingOptions


class RolloutError(RuntimeError):
    pass


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
        for a in new:
            self._call(a, "/update", {"version": version})
        if addresses:
            self.addresses = list(addresses)
        return new

    def close(self) -> None:
        self._http.close()

    def _call(self, address: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        url = f"http://{address}{path}"
        try:
            r = self._http.post(url, json=body or {})
        except httpx.HTTPError as e:
            raise RolloutError(f"{url}: {e}") from e
        if r.status_code >= 400:
            raise RolloutError(f"{url}: HTTP {r.status_code}: {r.text[:500]}")
        out: dict[str, Any] = r.json()
        return out

    def _all(self, path: str, body: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        with ThreadPoolExecutor(len(self.addresses)) as pool:
            return list(pool.map(lambda a: self._call(a, path, body), self.addresses))

    def generate(self, prompts: Sequence[str | list[int]], options: SamplingOptions,
                 n: int) -> tuple[list[list[Completion]], set[int | None]]:
        """n completions per prompt, spread over the rollouts in contiguous slices of prompts.

        Also returns the weight versions the rollouts generated with (one, when all are in sync).
        """
        k = len(self.addresses)
        slices = [list(prompts[i * len(prompts) // k:(i + 1) * len(prompts) // k]) for i in range(k)]
        body = {"options": options.model_dump(), "n": n}
        with ThreadPoolExecutor(k) as pool:
            parts = list(pool.map(lambda a_p: self._call(a_p[0], "/v1/generate", {**body, "prompts": a_p[1]})
                                  if a_p[1] else None, zip(self.addresses, slices, strict=True)))
        out: list[list[Completion]] = []
        versions: set[int | None] = set()
        for part in parts:
            if part is None:
                continue
            versions.add(part.get("version"))
            out += [[Completion.model_validate(c) for c in group] for group in part["completions"]]
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
