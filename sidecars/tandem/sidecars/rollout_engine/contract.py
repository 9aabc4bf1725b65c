"""The one contract between the trainer and the rollouts: every request and answer of the rollout's HTTP API.

Role: pydantic models of the bodies of `/v1/generate`, `/v1/trajectories`, the control operations (`/start`,
`/dummy_start`, `/update`, `/sleep`, `/wake_up`, `/terminate`), `/status` and `/health`. The rollout's server
parses requests and builds answers with them (routes.py, `tandem.sidecars.rollout.http_app`); the trainer's
rollout client builds requests and reads answers with them (`tandem.sidecars.trainer.loop.rollout.rollout_client`,
`rollout_health`). The field names are the JSON on the wire (snake_case; /health's camelCase, by alias). A
prompt's pictures travel as base64 of a PNG file (`encode_image` on the trainer's side, `decode_images` on the
rollout's, which refuses one that does not decode, naming the prompt and picture).
Imports nothing of vLLM: beside sampling.py, the one module of the rollout engine the trainer imports
(.importlinter, "the trainer imports nothing of the rollout engine but its request shapes").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, Field

from tandem.checkpoint_engine import errors
from tandem.checkpoint_engine.service.engine_status import EngineStatus, Health, UpdateReport
from tandem.sidecars.rollout_engine.sampling import Completion, SamplingOptions

__all__ = ["Completion", "DummyStartRequest", "EngineStatus", "GenerateRequest", "GenerateResponse", "Health",
           "SamplingOptions", "Served", "SleepRequest", "StartRequest", "StatusAnswer", "TimedAnswer",
           "TrajectoriesRequest", "TrajectoriesResponse", "TrajectoryOut", "UpdateReport", "UpdateRequest",
           "UpdateResponse"]


# ---- generation ---------------------------------------------------------------------------------
class GenerateRequest(BaseModel):
    """POST /v1/generate: n completions of each prompt (text or token ids)."""

    prompts: list[str | list[int]] = Field(min_length=1)
    options: SamplingOptions = Field(default_factory=SamplingOptions)
    n: int = Field(1, ge=1, le=1024)
    max_tokens: list[int] | None = Field(default=None, description="Per prompt, overriding options.maxTokens "
                                         "(the continuation of a partial rollout).")
    images: list[list[str]] | None = Field(default=None, description="Per prompt, its pictures (base64 of an "
                                           "image file: generation.encode_image), one per image placeholder, in "
                                           "order (vision-language models).")


class TrajectoriesRequest(BaseModel):
    """POST /v1/trajectories: n multi-turn trajectories of each row of chat messages."""

    rows: list[list[dict[str, Any]]] = Field(min_length=1, description="Each row's chat messages.")
    data: list[dict[str, Any]] | None = Field(default=None, description="Each row's dataset fields (question, "
                                              "answer, index), for the environment's reset (and reward).")
    options: SamplingOptions = Field(default_factory=SamplingOptions)
    n: int = Field(1, ge=1, le=1024)
    images: list[list[str]] | None = Field(default=None, description="Per row, its pictures (base64 of an image "
                                           "file), one per bare image part of its messages, in order "
                                           "(vision-language models).")


class TrajectoryOut(BaseModel):
    prompt_ids: list[int]
    completion_ids: list[int]
    mask: list[int]  # 1 on the model's tokens
    logprobs: list[float]  # the rollout's, 0 on the environment's tokens
    text: str  # the last model turn: what the job's rewards judge
    reward: float | None  # the environment's own
    finish: str
    turns: int
    tool_calls: int
    tool_errors: int
    tool_seconds: float
    tool_results: int = 0  # tool answers (not errors) that reached the model, in its context before a later turn
    pictures: list[str] = Field(default_factory=list)  # the environment's (base64 PNG), in the order of their tokens
    pictures_refused: int = 0  # pictures the environment sent that could not be used


class Served(BaseModel):
    """What every generation answer carries besides its results: the version that generated them and the
    driver's view of the engine's restarts and recoveries (its `rollout_restarts`, `rollout_recovery_s`)."""

    version: int | None = None  # defaults: a reader takes a stand-in rollout's answer without them
    seconds: float = 0.0
    restarts: int = 0  # engines started again after a failure
    recoveries: int = 0  # recoveries completed (a generation served after a failure)
    recovery_s: float | None = None  # the latest recovery's seconds


class GenerateResponse(Served):
    completions: list[list[Completion]]


class TrajectoriesResponse(Served):
    trajectories: list[list[TrajectoryOut]]


# ---- control operations ---------------------------------------------------------------------------
class StartRequest(BaseModel):
    """POST /start."""

    model_dir: str
    dummy: bool = False


class DummyStartRequest(BaseModel):
    """POST /dummy_start."""

    model_dir: str


class UpdateRequest(BaseModel):
    """POST /update: load `version` (None: the newest registered)."""

    version: int | None = Field(default=None, ge=0)


class SleepRequest(BaseModel):
    """POST /sleep."""

    level: int = Field(default=1, ge=1, le=2)


class StatusAnswer(BaseModel):
    """The answer of /sleep and /wake_up: the engine's status after it."""

    status: EngineStatus


class TimedAnswer(StatusAnswer):
    """The answer of /start, /dummy_start and /terminate: the status and the operation's timings."""

    timings: dict[str, float]


class UpdateResponse(StatusAnswer):
    """The answer of /update: the status and the load's report."""

    report: UpdateReport


def decode_images(encoded: Sequence[Sequence[str]]) -> list[list[Any]]:
    """Each prompt's pictures from the wire (base64 of an image file's bytes) as RGB images; BadRequest naming
    the prompt and picture that does not decode."""
    import base64
    import binascii
    import io

    from PIL import Image, UnidentifiedImageError

    out = []
    for i, pics in enumerate(encoded):
        row = []
        for j, data in enumerate(pics):
            try:
                image = Image.open(io.BytesIO(base64.b64decode(data, validate=True)))
                image.load()
            except (binascii.Error, ValueError, OSError, UnidentifiedImageError) as e:
                raise errors.BadRequest(f"prompt {i}, picture {j}: not a picture ({e})") from None
            row.append(image.convert("RGB"))
        out.append(row)
    return out


def encode_image(image: Any) -> str:
    """A picture as it travels to the rollout (PNG, base64): `GenerateRequest.images`."""
    import base64
    import io

    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()
