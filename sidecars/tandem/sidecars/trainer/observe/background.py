"""A tracking sink behind a bounded queue and one daemon thread: a slow or unreachable server never blocks
or fails training.

Role: the common part of the MLflow and W&B sinks (`tracking._MLflowWorker`, `wandb_sink.WandbSink`): the
driver's `submit` only queues the row (a full queue drops the oldest: training must not wait); the thread
hands each row to the subclass's `_log`; the first failure logs one warning naming the server, later ones are
logged at debug level and the next row tries again; `close` queues the end, the thread calls `_end` after the
rows before it, and `close` waits at most `timeout` seconds for it. Callers: `tracking.Tracker` (its sinks).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any

QUEUE_ROWS = 1024  # rows waiting for a server before the oldest is dropped

Item = tuple[int, dict[str, Any], int]  # step, payload, wall-clock milliseconds when it was submitted


class BackgroundSink:
    """Rows fed to `_log` by a daemon thread; `_end` after the last; never raises into the caller."""

    def __init__(self, name: str, where: str, log: logging.Logger) -> None:
        self.name, self.where, self.log = name, where, log  # "MLflow", the server as log lines name it
        self.failures = self.dropped = self.logged = 0
        self.failed_run = False  # close(failed=True): the run ends as failed
        self._warned = False
        self._queue: queue.Queue[Item | None] = queue.Queue(maxsize=QUEUE_ROWS)
        self._thread = threading.Thread(target=self._loop, name=f"tandem-{name.lower()}", daemon=True)
        self._thread.start()

    def submit(self, step: int, payload: dict[str, Any]) -> None:
        self._put((step, payload, int(time.time() * 1000)))

    def close(self, failed: bool, timeout: float) -> None:
        self.failed_run = failed
        self._put(None)
        self._thread.join(timeout)
        if self._thread.is_alive():
            self.log.warning("%s at %s: gave up waiting after %.0f s; %d row(s) not logged", self.name, self.where,
                             timeout, self._queue.qsize())
        elif self.failures or self.dropped:
            self.log.info("%s at %s: %d row(s) logged, %d failed, %d dropped (queue full)", self.name, self.where,
                          self.logged, self.failures, self.dropped)

    def _log(self, step: int, payload: dict[str, Any], stamp: int) -> None:
        raise NotImplementedError

    def _end(self) -> None:
        """After the last row: end the run (`failed_run` says how)."""

    def _put(self, item: Item | None) -> None:
        while True:
            try:
                self._queue.put_nowait(item)
                return
            except queue.Full:
                try:
                    self._queue.get_nowait()  # the oldest row goes: training must not wait for the server
                    self.dropped += 1
                except queue.Empty:
                    pass

    def _loop(self) -> None:
        while (item := self._queue.get()) is not None:
            step, payload, stamp = item
            try:
                self._log(step, payload, stamp)
                self.logged += 1
            except Exception as e:  # noqa: BLE001 - any failure of the server must leave training alone
                self.failed(f"logging iteration {step}", e)
        try:
            self._end()
        except Exception as e:  # noqa: BLE001
            self.failed("ending the run", e)

    def _clean(self, text: str) -> str:
        """An error's text as log lines may show it (MLflow: credentials in URLs redacted)."""
        return text

    def failed(self, what: str, e: Exception) -> None:
        """One warning for the first failure, debug lines after it."""
        self.failures += 1
        text = self._clean(str(e))
        if not self._warned:
            self._warned = True
            self.log.warning("%s at %s failed while %s (%s: %s); training goes on, later rows are retried "
                             "(further failures are logged at debug level)", self.name, self.where, what,
                             type(e).__name__, text.splitlines()[0][:300] if text else "")
        else:
            self.log.debug("%s at %s failed while %s: %s", self.name, self.where, what, text)
