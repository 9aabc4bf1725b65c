"""The rollout's OpenAI-compatible chat endpoint, served by the live vLLM, recording what agents sample.

Role: `POST /v1/chat/completions` (and `GET /v1/models`) for any client of the OpenAI API, and
`POST /agents/<trajectory id>/v1/chat/completions`, the same for an agent trajectory opened by the agent
driver (envs.agent): each call's prompt and sampled tokens, log-probs and weight version are recorded for
training (envs.recorder). Messages and `tools` render through the model's chat template
(envs.chat.ChatRenderer: templates that do not render tools get them in a Hermes system prompt); tool calls
in the reply are parsed in the job's toolCallFormat (envs.toolcalls) and returned as OpenAI `tool_calls`,
finish_reason `tool_calls`. Every call is a request in vLLM's running batch (rollout_engine.turns.TurnLoop),
so many agents' calls decode together. Recorded calls sample with the trainer's options (temperature, top_p,
top_k: what the log-probs are trained against); the agent's own sampling settings apply to unrecorded calls
only. `max_tokens`/`max_completion_tokens` are capped by rollout.maxTokens. `n` must be 1. Same bearer token
as the rest of the API (an OpenAI client's api_key). Caller: rollout/http_app.py.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any, Literal

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from tandem.checkpoint_engine import errors
from tandem.sidecars.envs import toolcalls
from tandem.sidecars.envs.chat import ChatRenderer, Message, Renderers, call_arguments, text_of
from tandem.sidecars.envs.recorder import Call, Recorder
from tandem.sidecars.rollout_engine.sampling import SamplingOptions
from tandem.sidecars.rollout_engine.turns import Turn, TurnLoop


class ChatRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # clients send fields we do not use (stream_options, user, ...)

    messages: list[dict[str, Any]] = Field(min_length=1)
    model: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    n: int = Field(default=1, ge=1, le=1)
    seed: int | None = None
    stop: str | list[str] | None = None
    logprobs: bool = False
    stream: Literal[False] = False


class Chat:
    """Chat calls on `loop`'s engine, rendered with `tokenizer`; `recorder` holds the agent trajectories."""

    def __init__(self, loop: TurnLoop, tokenizer: Any, recorder: Recorder, *, model: str,
                 style: toolcalls.Style = "hermes", max_tokens: int = 1024) -> None:
        self.loop, self.tok, self.recorder, self.model = loop, tokenizer, recorder, model
        self.style, self.max_tokens = style, max_tokens
        self.renderers = Renderers(tokenizer)

    def complete(self, req: ChatRequest, tid: str | None) -> dict[str, Any]:
        renderer = self.renderers.get(req.tools if req.tool_choice != "none" else None)

        def adapt(message: Message) -> Message:
            return _for_template(message, renderer)

        asked = req.max_completion_tokens or req.max_tokens
        if tid is None:
            prompt, extends = renderer.prompt_ids([adapt(m) for m in req.messages]), False
            limit = min(asked or self.max_tokens, self.max_tokens)
            stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
            options = SamplingOptions(temperature=1.0 if req.temperature is None else req.temperature,
                                      top_p=req.top_p or 1.0, seed=req.seed, stop=stop, max_tokens=limit)
        else:
            prompt, extends, limit, options = self.recorder.prepare(tid, req.messages, renderer, asked, adapt)
        done, version = self.loop.submit(Turn(tid or "chat", prompt, limit), options).result()
        parsed = toolcalls.parse(done.text, self.style) if renderer.tools else toolcalls.Parsed()
        calls = [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                  "function": {"name": c.name, "arguments": json.dumps(c.arguments)}} for c in parsed.calls]
        content = toolcalls.without_calls(done.text, self.style) if calls else done.text
        reply: Message = {"role": "assistant", "content": content or None, **({"tool_calls": calls} if calls else {})}
        if tid is not None:
            self.recorder.record(tid, Call(req.messages, prompt, done, version, reply, len(calls)), extends)
        finish = "tool_calls" if calls else ("length" if done.finish_reason == "length" else "stop")
        choice: dict[str, Any] = {"index": 0, "message": reply, "finish_reason": finish}
        if req.logprobs:
            pieces = self.tok.convert_ids_to_tokens(done.token_ids)
            choice["logprobs"] = {"content": [{"token": t, "logprob": lp, "bytes": None, "top_logprobs": []}
                                              for t, lp in zip(pieces, done.logprobs, strict=True)]}
        return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                "model": req.model or self.model, "choices": [choice], "system_fingerprint": f"version-{version}",
                "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(done.token_ids),
                          "total_tokens": len(prompt) + len(done.token_ids)}}


def _for_template(message: dict[str, Any], renderer: ChatRenderer) -> Message:
    """An OpenAI message as chat templates read it: text content; an assistant's tool calls written in the
    Hermes format where the template does not render `tool_calls` itself."""
    out = {**message, "content": text_of(message.get("content"))}
    if out.get("tool_calls") and not renderer.native_tools:
        blocks = []
        for c in out.pop("tool_calls"):
            fn = c.get("function", {})
            args = call_arguments(fn)
            blocks.append(f'{toolcalls.OPEN}\n{json.dumps({"name": fn.get("name"), "arguments": args})}\n'
                          f"{toolcalls.CLOSE}")
        out["content"] = "\n".join([out["content"], *blocks]).strip()
    return out


def routes(chat: Chat) -> APIRouter:
    """The endpoint's routes (the caller adds the bearer-token dependency)."""
    router = APIRouter()

    @router.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": chat.model, "object": "model", "owned_by": "tandem"}]}

    async def answer(req: ChatRequest, tid: str | None) -> Any:
        """The completion, or the error in OpenAI's shape (clients show error.message)."""
        try:
            if tid is not None and not tid.isalnum():
                raise errors.BadRequest(f"trajectory id {tid!r} is not alphanumeric")
            return await asyncio.to_thread(chat.complete, req, tid)
        except errors.CheckpointEngineError as e:
            return JSONResponse(status_code=e.status_code,
                                content={"error": {"message": str(e), "type": type(e).__name__, "code": e.code}})

    @router.post("/v1/chat/completions")
    async def completions(req: ChatRequest) -> Any:
        return await answer(req, None)

    @router.post("/agents/{tid}/v1/chat/completions")
    async def agent_completions(tid: str, req: ChatRequest) -> Any:
        return await answer(req, tid)

    return router
