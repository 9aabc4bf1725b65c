"""Agent trajectories: the user's agent drives the rollout's OpenAI-compatible endpoint; its calls train.

Role: `rollout.environment.type: agent`. For each (row, sample) the driver opens a trajectory id in the
`Recorder` and calls the agent function `entryPoint` on a worker thread as
`fn(base_url=..., api_key=..., row=..., **kwargs)`: `base_url` is the endpoint for that trajectory
(`.../agents/<id>/v1`, what any OpenAI client takes as its base URL), `api_key` the rollout's bearer token,
`row` the dataset row (`messages`, `question`, `answer`, `index`). Whatever framework the agent uses, each
of its chat calls is served by the live vLLM in the running batch (`rollout_engine.turns.TurnLoop`) and
recorded; the function returns the trajectory's reward (a number) or None (the job's rewards judge the last
reply). When every agent has returned or the deadline (trajectoryTimeoutSeconds) has passed, each
trajectory becomes one training sample: its last chain of calls (envs.recorder), the model's tokens masked
in, everything else out. An agent that raises keeps what it made, with no reward of its own; its error is
logged. A thread still running after the deadline cannot be killed: its later calls are refused.
Caller: the rollout sidecar (`/v1/trajectories`, like envs.multi_turn.MultiTurnDriver), tests.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

from tandem.sidecars.envs.chat import ChatRenderer
from tandem.sidecars.envs.environments import Message, TurnStats
from tandem.sidecars.envs.multi_turn import Result
from tandem.sidecars.envs.recorder import Record, Recorder
from tandem.sidecars.envs.trajectory import Trajectory
from tandem.sidecars.rollout_engine.sampling import SamplingOptions

log = logging.getLogger("tandem.rollout.agent")
Agent = Callable[..., Any]


class AgentDriver:
    def __init__(self, agent: Agent, kwargs: Mapping[str, Any], recorder: Recorder, renderer: ChatRenderer,
                 base_url: str, api_key: str, *, seconds: float = 600.0, workers: int = 32) -> None:
        """`base_url`: this rollout's endpoint root as agents reach it (http://127.0.0.1:<port>)."""
        self.agent, self.kwargs, self.recorder, self.renderer = agent, dict(kwargs), recorder, renderer
        self.base_url, self.api_key, self.seconds = base_url.rstrip("/"), api_key, seconds
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="agent")

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    image_token = None  # agents' calls carry no pictures (the spec refuses a vision-language model's agent job)

    def run(self, rows: Sequence[Mapping[str, Any]], messages: Sequence[list[Message]], n: int,
            options: SamplingOptions, version: int, images: Sequence[Sequence[Any]] | None = None
            ) -> list[list[Result]]:
        """`n` agent trajectories per row; every call of theirs samples with `options` (the trainer's)."""
        if images is not None and any(images):
            raise ValueError("agents' calls carry no pictures (rollout.environment.type agent)")
        ids = [[uuid.uuid4().hex for _ in range(n)] for _ in rows]
        futures = {}
        for i, (row, start) in enumerate(zip(rows, messages, strict=True)):
            for tid in ids[i]:
                self.recorder.open(tid, options, self.seconds)
                futures[tid] = self.pool.submit(
                    self.agent, base_url=f"{self.base_url}/agents/{tid}/v1", api_key=self.api_key,
                    row={**row, "messages": list(start)}, **self.kwargs)
        done, late = wait(futures.values(), timeout=self.seconds)
        out: list[list[Result]] = []
        for i, start in enumerate(messages):
            out.append([self._result(tid, start, futures[tid] in late, futures[tid]) for tid in ids[i]])
        if late:
            log.warning("%d of %d agent trajectories passed trajectoryTimeoutSeconds (%.0f s): they train on "
                        "what they made", len(late), len(futures), self.seconds)
        return out

    def _result(self, tid: str, start: list[Message], late: bool, fut: Any) -> Result:
        record = self.recorder.close(tid)
        reward, error = None, None
        if not late:
            error = fut.exception()
            if error is None:
                got = fut.result()
                reward = None if got is None else float(got)
            else:
                log.warning("agent trajectory %s raised %s: %s", tid, type(error).__name__, error)
        traj = record.chains[-1] if record.chains else Trajectory(self.renderer.prompt_ids(start))
        if record.unused_calls:
            log.info("agent trajectory %s: %d calls in earlier chains do not train (its history was rewritten)",
                     tid, record.unused_calls)
        last = record.last  # the agent runs its tools: their answers are the tool messages its last call sent
        stats = TurnStats(turns=traj.model_turns, tool_calls=record.tool_calls,
                          tool_results=sum(m.get("role") == "tool" for m in last.messages) if last else 0)
        return Result(traj, stats, final_text=last.completion.text if last else "", reward=reward,
                      finish=_finish(record, late, error), messages=[*start, *([last.reply] if last else [])])


def _finish(record: Record, late: bool, error: BaseException | None) -> str:
    if late:
        return "timeout"
    if error is not None:
        return "error"
    if record.last is not None and record.last.completion.finish_reason == "length":
        return "length"
    return "answer"
