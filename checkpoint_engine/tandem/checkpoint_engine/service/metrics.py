"""Prometheus view of one checkpoint engine, read from its status at scrape time.

Role: `EngineCollector(core)` turns the core's `EngineStatus` (rollout engine or Publisher) into
metrics when /metrics is scraped — nothing is recorded on the hot path:
  tandem_engine_phase{role,phase}        1 for the engine's current phase, 0 for the others
  tandem_engine_version{role}            weight version loaded (rollout) or last published (trainer)
  tandem_engine_step_seconds{role,step}  duration of the latest step of each kind (start, update,
                                         verify, write, register, terminate…), from the core's timings
  tandem_engine_error{role}              1 while the last operation left an error
  tandem_engine_restarts{role}           engines started again after a failure (the rollout's supervisor)
  tandem_engine_stalled_seconds{role}    how long the call into vLLM now in progress has gone without progress
                                         (0 between calls)
  tandem_engine_stall_deadline_seconds{role}  how long it may (rollout: the supervisor kills it past that)
  tandem_engine_recovery_seconds{role}   the latest recovery: from a failure found to the first generation after
`metrics_response(registry)` renders a registry for the API route. Callers: `api.create_app`
(registers the collector and serves GET /metrics); the trainer adds its loop metrics to the same
registry (`tandem.sidecars.trainer.observe.prom`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tandem.checkpoint_engine.service.engine_status import EngineStatus, Phase


class EngineCore(Protocol):
    """A checkpoint engine's core: the trainer's Publisher or the rollout's engine
    (`tandem.sidecars.rollout_engine.engine.RolloutEngine`)."""

    def status(self) -> EngineStatus: ...


class EngineCollector(Collector):
    def __init__(self, core: EngineCore) -> None:
        self.core = core

    def collect(self) -> Iterator[Metric]:
        st: EngineStatus = self.core.status()
        phase = GaugeMetricFamily("tandem_engine_phase", "1 for the checkpoint engine's current phase",
                                  labels=["role", "phase"])
        for p in Phase:
            phase.add_metric([st.role, p.value], 1.0 if st.phase == p else 0.0)
        yield phase
        version = GaugeMetricFamily("tandem_engine_version", "Weight version loaded or last published",
                                    labels=["role"])
        if st.version is not None:
            version.add_metric([st.role], float(st.version))
        yield version
        steps = GaugeMetricFamily("tandem_engine_step_seconds", "Duration of the latest step of each kind",
                                  labels=["role", "step"])
        for key, seconds in sorted(st.timings.items()):
            steps.add_metric([st.role, key.removesuffix("_s")], float(seconds))
        yield steps
        error = GaugeMetricFamily("tandem_engine_error", "1 while the last operation left an error",
                                  labels=["role"])
        error.add_metric([st.role], 1.0 if st.error else 0.0)
        yield error
        restarts = GaugeMetricFamily("tandem_engine_restarts", "Engines started again after a failure (rollout)",
                                     labels=["role"])
        restarts.add_metric([st.role], float(st.restarts))
        yield restarts
        stalled = GaugeMetricFamily("tandem_engine_stalled_seconds", "How long the call into the engine now in "
                                    "progress has run; 0 between calls (rollout)", labels=["role"])
        stalled.add_metric([st.role], float(st.stalled_s))
        yield stalled
        limit = GaugeMetricFamily("tandem_engine_stall_deadline_seconds", "How long the call into the engine "
                                  "now in progress (between calls: a step) may go without progress (rollout)",
                                  labels=["role"])
        if st.stall_deadline_s is not None:
            limit.add_metric([st.role], float(st.stall_deadline_s))
        yield limit
        recovery = GaugeMetricFamily("tandem_engine_recovery_seconds", "Seconds from the latest failure found to "
                                     "the first generation after the restart (rollout)", labels=["role"])
        if st.recovery_s is not None:
            recovery.add_metric([st.role], float(st.recovery_s))
        yield recovery


def engine_registry(core: EngineCore, registry: CollectorRegistry | None = None) -> CollectorRegistry:
    """`registry` (a new one by default) with the engine's collector registered."""
    registry = registry if registry is not None else CollectorRegistry(auto_describe=False)
    registry.register(EngineCollector(core))
    return registry


def metrics_response(registry: CollectorRegistry) -> tuple[bytes, str]:
    """(body, content type) of the Prometheus text exposition of `registry`."""
    return generate_latest(registry), CONTENT_TYPE_LATEST
