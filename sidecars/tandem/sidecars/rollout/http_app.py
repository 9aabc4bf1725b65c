"""The rollout sidecar's HTTP app: the checkpoint engine's control API plus `/v1/generate`.

Role: thin routes over `RolloutEngine` (`tandem.sidecars.rollout_engine`): its `routes.create_app` supplies
health, status, start, update, terminate, sleep, wake_up; this module adds generation for the driver, with the
same bearer token: `/v1/generate` (one reply per prompt); where the job's rollout.environment has turns,
`/v1/trajectories` (multi-turn: `envs.multi_turn.MultiTurnDriver`, or `envs.agent.AgentDriver` for agents); and
the OpenAI-compatible chat endpoint (`openai_api`). Each generation answer also carries the engine's restarts
and its latest recovery (`contract.Served`). Requests and answers are the contract's
(`tandem.sidecars.rollout_engine.contract`), which the trainer's client uses too.
Caller: `python -m tandem.sidecars.rollout`.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import APIRouter, Depends, FastAPI

from tandem.checkpoint_engine import errors
from tandem.sidecars.envs.multi_turn import Result
from tandem.sidecars.rollout.openai_api import Chat, routes
from tandem.sidecars.rollout_engine.contract import (
    GenerateRequest,
    GenerateResponse,
    TrajectoriesRequest,
    TrajectoriesResponse,
    TrajectoryOut,
    decode_images,
    encode_image,
)
from tandem.sidecars.rollout_engine.engine import RolloutEngine
from tandem.sidecars.rollout_engine.routes import create_app


def _out(r: Result, image_token: int | None) -> TrajectoryOut:
    """A finished trajectory as the trainer reads it: each picture's placeholder as its image tokens (as vLLM held
    them), the pictures its environment answered with beside it."""
    t = r.trajectory
    held = t.expanded(image_token)
    return TrajectoryOut(prompt_ids=held.prompt_ids, completion_ids=held.completion_ids, mask=held.mask,
                         logprobs=held.logprobs, text=r.final_text, reward=r.reward, finish=r.finish,
                         turns=r.stats.turns or t.model_turns, tool_calls=r.stats.tool_calls,
                         tool_errors=r.stats.tool_errors, tool_seconds=r.stats.tool_seconds,
                         tool_results=r.stats.tool_results, pictures=[encode_image(p) for p in t.env_pictures],
                         pictures_refused=r.pictures_refused)


def _served(engine: RolloutEngine) -> dict[str, Any]:
    return {"restarts": engine.restarts, "recoveries": engine.recovery.recoveries,
            "recovery_s": engine.recovery.last_s}


def build_app(engine: RolloutEngine, token: str, turns: Any = None, chat: Chat | None = None) -> FastAPI:
    """The routes; `turns`: the job's multi-turn driver, MultiTurnDriver or AgentDriver (None:
    /v1/trajectories answers 405); `chat`: the OpenAI-compatible endpoint (None: not served)."""
    app = create_app(engine, token)
    router = APIRouter(dependencies=[Depends(app.state.auth)])
    if chat is not None:
        router.include_router(routes(chat))

    @router.post("/v1/generate")
    async def generate(req: GenerateRequest) -> GenerateResponse:
        t = time.perf_counter()
        images = decode_images(req.images) if req.images is not None else None
        out: Any = await asyncio.to_thread(engine.generate, req.prompts, req.options, req.n, req.max_tokens, images)
        return GenerateResponse(completions=out, version=engine.version, seconds=time.perf_counter() - t,
                                **_served(engine))

    @router.post("/v1/trajectories")
    async def trajectories(req: TrajectoriesRequest) -> TrajectoriesResponse:
        if turns is None:
            raise errors.UnsupportedOperation("this job's rollouts are single-turn (rollout.environment)")
        t = time.perf_counter()
        version = engine.version
        data = req.data or [{} for _ in req.rows]
        if len(data) != len(req.rows):
            raise errors.BadRequest(f"data has {len(data)} entries for {len(req.rows)} rows")
        images = decode_images(req.images) if req.images is not None else None
        if images is not None and len(images) != len(req.rows):
            raise errors.BadRequest(f"images has {len(images)} entries for {len(req.rows)} rows")
        out = await asyncio.to_thread(turns.run, data, req.rows, req.n, req.options,
                                      -1 if version is None else version, images)
        return TrajectoriesResponse(trajectories=[[_out(r, turns.image_token) for r in row] for row in out],
                                    version=version,
                                    seconds=time.perf_counter() - t, **_served(engine))

    app.include_router(router)
    return app
