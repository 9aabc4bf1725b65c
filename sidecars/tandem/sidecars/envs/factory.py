"""The job's environment and limits from its spec (`rollout.environment`), for the rollout sidecar's driver.

Role: one ToolBox per job (its bounded worker pool and per-call timeout shared by every trajectory), a fresh
`ToolEnvironment` per trajectory; `Limits` from the environment's fields and rollout.maxTokens (a model
turn's tokens). Caller: `tandem.sidecars.rollout.__main__` (MultiTurnDriver), tests.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tandem.sidecars.envs.base import Environment, SingleTurn, ToolEnvironment
from tandem.sidecars.envs.driver import Limits
from tandem.sidecars.envs.tools import ToolBox, calculator
from tandem.spec.environment import Environment as EnvironmentSpec

TOOLS: dict[str, Callable[..., Any]] = {"calculator": calculator}


def make_environments(spec: EnvironmentSpec | None) -> Callable[[], Environment]:
    """A factory of fresh environments for trajectories of the job."""
    if spec is None or spec.type == "single":
        return SingleTurn
    box = ToolBox([TOOLS[name] for name in spec.tools], timeout_seconds=spec.tool_timeout_seconds)
    return lambda: ToolEnvironment(box, style=spec.tool_call_format, max_turns=spec.max_turns)


def limits(spec: EnvironmentSpec | None, max_turn_tokens: int) -> Limits:
    if spec is None:
        return Limits(max_turns=1, max_turn_tokens=max_turn_tokens, max_total_tokens=max_turn_tokens)
    return Limits(max_turns=spec.max_turns, max_turn_tokens=max_turn_tokens, max_total_tokens=spec.max_total_tokens,
                  max_tool_output_tokens=spec.max_tool_output_tokens)
