"""The rollout engine's operations on the checkpoint engine's control API: start, update, terminate, sleep.

`create_app(engine, token)` is `tandem.checkpoint_engine.api.create_app` (health, status, metrics, auth, typed
errors, one operation at a time) with these routes (all need the bearer token):
    POST /start        {model_dir, dummy}
    POST /dummy_start  {model_dir}
    POST /update       {version|null}     (null: latest)
    POST /terminate
    POST /sleep {level}, POST /wake_up
Caller: the rollout sidecar (`tandem.sidecars.rollout.server`, which adds /generate and the rest), tests.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from fastapi import APIRouter, FastAPI
from prometheus_client import CollectorRegistry
from pydantic import BaseModel, Field

from tandem.checkpoint_engine import api
from tandem.checkpoint_engine.api import Serial
from tandem.sidecars.rollout_engine.engine import RolloutEngine


class StartRequest(BaseModel):
    model_dir: str
    dummy: bool = False


class DummyStartRequest(BaseModel):
    model_dir: str


class UpdateRequest(BaseModel):
    version: int | None = Field(default=None, ge=0)


class SleepRequest(BaseModel):
    level: int = Field(default=1, ge=1, le=2)


def rollout_router(engine: RolloutEngine, serial: Serial) -> APIRouter:
    r = APIRouter()

    @r.post("/start")
    async def start(req: StartRequest) -> dict[str, Any]:
        timings = await serial.run(engine.start, req.model_dir, req.dummy)
        return {"status": engine.status().model_dump(mode="json"), "timings": timings}

    @r.post("/dummy_start")
    async def dummy_start(req: DummyStartRequest) -> dict[str, Any]:
        timings = await serial.run(engine.start, req.model_dir, True)
        return {"status": engine.status().model_dump(mode="json"), "timings": timings}

    @r.post("/update")
    async def update(req: UpdateRequest) -> dict[str, Any]:
        report = await serial.run(engine.update, req.version)
        return {"status": engine.status().model_dump(mode="json"), "report": report.model_dump(mode="json")}

    @r.post("/terminate")
    async def terminate() -> dict[str, Any]:
        timings = await serial.run(engine.terminate)
        return {"status": engine.status().model_dump(mode="json"), "timings": timings}

    @r.post("/sleep")
    async def sleep(req: SleepRequest) -> dict[str, Any]:
        await serial.run(engine.sleep, req.level)
        return {"status": engine.status().model_dump(mode="json")}

    @r.post("/wake_up")
    async def wake_up() -> dict[str, Any]:
        await serial.run(engine.wake_up)
        return {"status": engine.status().model_dump(mode="json")}

    return r


def create_app(engine: RolloutEngine, token: str | None = None,
               registry: CollectorRegistry | None = None) -> FastAPI:
    """The checkpoint engine's control app over `engine`, with the rollout's operations."""
    return api.create_app(engine, token, registry, partial(rollout_router, engine))
