"""The rollout sidecar's HTTP app: the checkpoint engine's control API plus `/v1/generate`.

Role: thin routes over `RolloutEngine` (checkpoint_engine): `create_app` supplies health, status,
start, update, terminate, sleep, wake_up; this module adds generation for the driver, with the
same bearer token. Caller: `python -m tandem.sidecars.rollout`.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import APIRouter, Depends, FastAPI
from pydantic import BaseModel, Field

from tandem.checkpoint_engine import api
from tandem.checkpoint_engine.models import Completion, SamplingOptions
from tandem.checkpoint_engine.rollout_engine import RolloutEngine


class GenerateRequest(BaseModel):
    prompts: list[str | list[int]] = Field(min_length=1)
    options: SamplingOptions = Field(default_factory=SamplingOptions)
    n: int = Field(1, ge=1, le=1024)
    max_tokens: list[int] | None = Field(default=None, description="Per prompt, overriding options.maxTokens "
                                         "(the continuation of a partial rollout).")


class GenerateResponse(BaseModel):
    completions: list[list[Completion]]
    version: int | None
    seconds: float


def build_app(engine: RolloutEngine, token: str) -> FastAPI:
    app = api.create_app(engine, token)
    router = APIRouter(dependencies=[Depends(app.state.auth)])

    @router.post("/v1/generate")
    async def generate(req: GenerateRequest) -> GenerateResponse:
        t = time.perf_counter()
        out: Any = await asyncio.to_thread(engine.generate, req.prompts, req.options, req.n, req.max_tokens)
        return GenerateResponse(completions=out, version=engine.version, seconds=time.perf_counter() - t)

    app.include_router(router)
    return app
