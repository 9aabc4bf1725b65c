"""The rollout engine's operations on the checkpoint engine's control API: start, update, terminate, sleep.

`create_app(engine, token)` is `tandem.checkpoint_engine.service.api.create_app` (health, status, metrics, auth, typed
errors, one operation at a time) with these routes (all need the bearer token):
    POST /start        {model_dir, dummy}
    POST /dummy_start  {model_dir}
    POST /update       {version|null}     (null: latest)
    POST /terminate
    POST /sleep {level}, POST /wake_up
Their request and answer bodies are contract.py's (the trainer's client uses the same models).
Caller: the rollout sidecar (`tandem.sidecars.rollout.http_app`, which adds /generate and the rest), tests.
"""

from __future__ import annotations

from functools import partial

from fastapi import APIRouter, FastAPI
from prometheus_client import CollectorRegistry

from tandem.checkpoint_engine.service import api
from tandem.checkpoint_engine.service.api import Serial
from tandem.sidecars.rollout_engine.contract import (
    DummyStartRequest,
    SleepRequest,
    StartRequest,
    StatusAnswer,
    TimedAnswer,
    UpdateRequest,
    UpdateResponse,
)
from tandem.sidecars.rollout_engine.engine import RolloutEngine


def rollout_router(engine: RolloutEngine, serial: Serial) -> APIRouter:
    r = APIRouter()

    @r.post("/start")
    async def start(req: StartRequest) -> TimedAnswer:
        timings = await serial.run(engine.start, req.model_dir, req.dummy)
        return TimedAnswer(status=engine.status(), timings=timings)

    @r.post("/dummy_start")
    async def dummy_start(req: DummyStartRequest) -> TimedAnswer:
        timings = await serial.run(engine.start, req.model_dir, True)
        return TimedAnswer(status=engine.status(), timings=timings)

    @r.post("/update")
    async def update(req: UpdateRequest) -> UpdateResponse:
        report = await serial.run(engine.update, req.version)
        return UpdateResponse(status=engine.status(), report=report)

    @r.post("/terminate")
    async def terminate() -> TimedAnswer:
        timings = await serial.run(engine.terminate)
        return TimedAnswer(status=engine.status(), timings=timings)

    @r.post("/sleep")
    async def sleep(req: SleepRequest) -> StatusAnswer:
        await serial.run(engine.sleep, req.level)
        return StatusAnswer(status=engine.status())

    @r.post("/wake_up")
    async def wake_up() -> StatusAnswer:
        await serial.run(engine.wake_up)
        return StatusAnswer(status=engine.status())

    return r


def create_app(engine: RolloutEngine, token: str | None = None,
               registry: CollectorRegistry | None = None) -> FastAPI:
    """The checkpoint engine's control app over `engine`, with the rollout's operations."""
    return api.create_app(engine, token, registry, partial(rollout_router, engine))
