"""FastAPI control API of one checkpoint engine: a thin HTTP layer over a Publisher or a rollout engine.

Caller: the trainer sidecar (`create_app(publisher, token)`), the rollout engine's routes
(`tandem.sidecars.rollout_engine.routes.create_app`: this app with the rollout's operations, served by the
rollout sidecar, which adds its own /generate router), the driver and the operator as HTTP clients.
Operations and statuses also go to etcd (the cores do that).

Routes (all but /health and /metrics need `Authorization: Bearer <token>`, the token of the job's Secret,
default env TANDEM_TOKEN):
    GET  /health                     readiness (`engine_status.Health`), no token: 503 while the engine is
                                     FAILED or being restarted (supervisor); its progress (steps, stalledS,
                                     and stallDeadlineS: how long the open call may go without it,
                                     stallDeadline: why), version, restarts, recoveries and recoveryS (the
                                     latest, failure to first generation)
    GET  /metrics                    Prometheus text (checkpoint_engine.service.metrics), no token
    GET  /status                     EngineStatus (phase, version, timings)
    POST /start, /dummy_start, /update, /terminate, /sleep, /wake_up   the rollout's operations
                                     (tandem.sidecars.rollout_engine.routes); a publisher answers 405
    POST /gc                                 publisher only
Typed errors map to status codes (errors.py): 400 bad request (`prompt_too_long`: a prompt with no room
for a generated token in max_model_len), 404 unknown version, 409 wrong phase or busy,
422 invalid/torn version, 503 engine not running or etcd unavailable, 405 unsupported.
"""

from __future__ import annotations

import hmac
import os
import threading
from collections.abc import Callable
from functools import partial
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry
from starlette.concurrency import run_in_threadpool

from tandem.checkpoint_engine import errors
from tandem.checkpoint_engine.service import metrics
from tandem.checkpoint_engine.service.engine_status import Health, Phase
from tandem.checkpoint_engine.service.metrics import EngineCore
from tandem.checkpoint_engine.service.publisher import Publisher

Operations = Callable[["Serial"], APIRouter]  # a core's POST routes, given the app's one-at-a-time runner


def bearer_auth(token: str) -> Callable[[Request], None]:
    """A FastAPI dependency that rejects requests without `Authorization: Bearer <token>`."""
    expected = f"Bearer {token}".encode()

    def check(request: Request) -> None:
        got = request.headers.get("authorization", "").encode()
        if not hmac.compare_digest(got, expected):
            raise _Unauthorized()

    return check


class _Unauthorized(Exception):
    pass


class Serial:
    """One operation at a time; a second one while busy is a 409, not a queue."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        if not self._lock.acquire(blocking=False):
            raise errors.WrongPhase("another operation is in progress")
        try:
            return await run_in_threadpool(fn, *args)
        finally:
            self._lock.release()


def _publisher_router(pub: Publisher, serial: Serial) -> APIRouter:
    r = APIRouter()

    @r.post("/gc")
    async def gc() -> dict[str, Any]:
        return {"collected": await serial.run(pub.gc)}

    for path in ("/start", "/dummy_start", "/update", "/terminate", "/sleep", "/wake_up"):

        async def unsupported(_path: str = path) -> None:
            raise errors.UnsupportedOperation(f"{_path} is a rollout-engine operation; this is a publisher")

        r.add_api_route(path, unsupported, methods=["POST"])
    return r


def create_app(core: EngineCore, token: str | None = None, registry: CollectorRegistry | None = None,
               operations: Operations | None = None) -> FastAPI:
    """The control app; `app.state.auth` is the auth dependency for routers added later, e.g.
    `app.include_router(my_router, dependencies=[Depends(app.state.auth)])`. GET /metrics serves
    `registry` (a new one by default) with the engine's collector added. `operations` builds the core's
    POST routes (the rollout engine's: `tandem.sidecars.rollout_engine.routes`); by default the publisher's."""
    token = token if token is not None else os.environ.get("TANDEM_TOKEN")
    if not token:
        raise ValueError("the control API needs a token (argument or TANDEM_TOKEN); refusing to run open")
    auth = bearer_auth(token)
    app = FastAPI(title="tandem checkpoint engine")
    app.state.core = core
    app.state.auth = auth
    app.state.serial = Serial()

    @app.exception_handler(errors.CheckpointEngineError)
    async def typed_error(_: Request, exc: errors.CheckpointEngineError) -> JSONResponse:
        return JSONResponse(
            status_code=exc.status_code,
            content={"error": exc.code, "type": type(exc).__name__, "detail": str(exc)},
        )

    @app.exception_handler(_Unauthorized)
    async def unauthorized(_: Request, __: _Unauthorized) -> JSONResponse:
        return JSONResponse(
            status_code=401,
            content={"error": "unauthorized", "detail": "bearer token required"},
            headers={"WWW-Authenticate": "Bearer"},
        )

    @app.get("/health")
    async def health() -> JSONResponse:
        st = core.status()
        serving = st.phase != Phase.FAILED and not getattr(core, "recovering", False)
        return JSONResponse(status_code=200 if serving else 503, content=Health.of(st, serving).body())

    scraped = metrics.engine_registry(core, registry)

    @app.get("/metrics")
    async def prometheus() -> Response:
        body, content_type = metrics.metrics_response(scraped)
        return Response(body, media_type=content_type)

    common = APIRouter()

    @common.get("/status")
    async def status() -> dict[str, Any]:
        return core.status().model_dump(mode="json")

    app.include_router(common, dependencies=[Depends(auth)])
    if operations is None:
        if not isinstance(core, Publisher):
            raise TypeError(f"{type(core).__name__} needs its operations (only a Publisher's are built in)")
        operations = partial(_publisher_router, core)
    app.include_router(operations(app.state.serial), dependencies=[Depends(auth)])
    return app
