"""What an agent's calls to the OpenAI-compatible endpoint sampled, per trajectory id, as training tokens.

Role: token-in, token-out for agents that only speak text. An agent sends its whole conversation with every
call; rendering it again would re-tokenize what the model wrote. So each call is matched against the
trajectory's previous one: when its messages are the previous call's messages, then the reply we returned
(content and tool calls, compared after normalising), then new messages (tool results, the user), the prompt
is the previous call's prompt and sampled tokens followed by `ChatRenderer.continuation_ids` of the new
messages: the call extends the trajectory exactly, and what trains is what was sampled. A call that does not
extend (the agent rewrote its history, or the previous reply was cut mid-turn) starts a new chain from the
chat template. A trajectory trains on the chain of its last call, the one whose answer is judged; the calls
of earlier chains are counted (`unused_calls`) and logged, not trained.
Limits (from rollout.environment): calls per trajectory, completion tokens per chain, a deadline; a call
past them is refused (`TrajectoryClosed`), and the trajectory keeps what it made.
Caller: the endpoint (tandem.sidecars.rollout.openai_api) and the agent driver (envs.agent).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tandem.checkpoint_engine import errors
from tandem.sidecars.envs.chat import ChatRenderer, Message, call_arguments, text_of
from tandem.sidecars.envs.trajectory import Trajectory
from tandem.sidecars.rollout_engine.sampling import Completion, SamplingOptions


class TrajectoryClosed(errors.BadRequest):
    """A call for a trajectory that is unknown, finished, or past its limits."""

    status_code = 409
    code = "trajectory_closed"


def normalise(message: Message) -> tuple[Any, ...]:
    """What identifies a message when an agent sends it back: role, text, tool calls (name, arguments)."""
    calls = []
    for c in message.get("tool_calls") or []:
        fn = c.get("function", c) if isinstance(c, dict) else {}
        calls.append((fn.get("name"), json.dumps(call_arguments(fn), sort_keys=True)))
    return message.get("role"), text_of(message.get("content")).strip(), tuple(calls)


@dataclass
class Call:
    messages: list[Message]
    prompt_ids: list[int]
    completion: Completion
    version: int | None
    reply: Message  # the assistant message the endpoint returned
    tool_calls: int


@dataclass
class Record:
    """One agent trajectory: its chains of calls, each chain one token sequence."""

    options: SamplingOptions  # what every call samples with (the trainer's), max_tokens aside
    deadline: float
    chains: list[Trajectory] = field(default_factory=list)
    chain_calls: list[int] = field(default_factory=list)
    last: Call | None = None
    calls: int = 0
    tool_calls: int = 0

    @property
    def unused_calls(self) -> int:
        return sum(self.chain_calls[:-1])


class Recorder:
    def __init__(self, *, max_calls: int, max_turn_tokens: int, max_total_tokens: int) -> None:
        self.max_calls, self.max_turn_tokens, self.max_total_tokens = max_calls, max_turn_tokens, max_total_tokens
        self._records: dict[str, Record] = {}
        self._lock = threading.Lock()

    def open(self, tid: str, options: SamplingOptions, seconds: float) -> None:
        with self._lock:
            self._records[tid] = Record(options, time.monotonic() + seconds)

    def close(self, tid: str) -> Record:
        with self._lock:
            return self._records.pop(tid)

    def prepare(self, tid: str, messages: list[Message], renderer: ChatRenderer, max_tokens: int | None,
                adapt: Callable[[Message], Message] = dict) -> tuple[list[int], bool, int, SamplingOptions]:
        """(prompt ids, whether they extend the previous call, max tokens of this call, sampling options) for
        a call with the agent's `messages`; `adapt` turns one into what the chat template reads."""
        with self._lock:
            record = self._records.get(tid)
            if record is None:
                raise TrajectoryClosed(f"trajectory {tid!r} is not open: unknown, or finished")
            if record.calls >= self.max_calls:
                raise TrajectoryClosed(f"trajectory {tid!r} made its {self.max_calls} calls "
                                       "(rollout.environment.maxTurns)")
            if time.monotonic() > record.deadline:
                raise TrajectoryClosed(f"trajectory {tid!r} is past its deadline "
                                       "(rollout.environment.trajectoryTimeoutSeconds)")
            last = record.last
            chain_start = len(record.chains[-1].prompt_ids) if record.chains else 0
        prompt, extends = None, False
        if last is not None and last.completion.token_ids and \
                last.completion.token_ids[-1] == renderer.end_of_turn and len(messages) > len(last.messages) and \
                [normalise(m) for m in messages[:len(last.messages) + 1]] == \
                [normalise(m) for m in [*last.messages, last.reply]]:
            new = messages[len(last.messages) + 1:]
            if new:
                prompt = last.prompt_ids + last.completion.token_ids + \
                    renderer.continuation_ids([adapt(m) for m in new])
                extends = True
        if prompt is None:
            prompt = renderer.prompt_ids([adapt(m) for m in messages])
        used = len(prompt) - chain_start if extends else 0  # completion tokens of the chain so far
        left = min(self.max_turn_tokens, self.max_total_tokens - used, max_tokens or self.max_turn_tokens)
        if left < 1:
            raise TrajectoryClosed(f"trajectory {tid!r} spent its {self.max_total_tokens} tokens "
                                   "(rollout.environment.maxTotalTokens)")
        return prompt, extends, left, record.options

    def record(self, tid: str, call: Call, extends: bool) -> None:
        with self._lock:
            record = self._records.get(tid)
            if record is None:
                return  # closed meanwhile (deadline): that call's tokens do not train
            chain = record.chains[-1] if record.chains else None
            so_far = chain.prompt_ids + chain.completion_ids if chain is not None else []
            if extends and chain is not None and call.prompt_ids[:len(so_far)] == so_far:
                chain.add_env(call.prompt_ids[len(so_far):])  # (calls made at once: only one extends)
                record.chain_calls[-1] += 1
            else:
                chain = Trajectory(list(call.prompt_ids))
                record.chains.append(chain)
                record.chain_calls.append(1)
            chain.add_model(call.completion.token_ids, call.completion.logprobs, call.version or 0)
            record.last = call
            record.calls += 1
            record.tool_calls += call.tool_calls
