"""The job's environment and limits from its spec (`rollout.environment`), for the rollout sidecar's driver.

Role: one ToolBox per job (its bounded worker pool and per-call timeout shared by every trajectory), a fresh
environment per trajectory: `ToolEnvironment` over the built-in tools (`calculator`, the sandboxed `python`)
and the user's tool functions (`package.module:function`), or the user's environment class (`custom`,
built with `kwargs`); `agent_function` for type agent. Module paths are imported once, with `pythonPath`
searched first (`loader.load`); what cannot be imported or is not what the type needs is refused with
`EnvironmentLoadError`, naming the field. `Limits` come from the environment's fields and rollout.maxTokens
(a model turn's tokens). Caller: `tandem.sidecars.rollout.__main__` (the drivers), tests.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, cast

from tandem.sidecars.envs.environments import Environment, SingleTurn, ToolEnvironment
from tandem.sidecars.envs.loader import FIELD, load, tool_functions
from tandem.sidecars.envs.loader import EnvironmentLoadError as EnvironmentLoadError
from tandem.sidecars.envs.multi_turn import Limits
from tandem.sidecars.envs.tools import ToolBox, ToolError
from tandem.spec.environment import Environment as EnvironmentSpec

SANDBOX_START_SECONDS = 5.0


def tool_box(spec: EnvironmentSpec) -> ToolBox:
    fns = tool_functions(spec)
    # the python tool's program gets tool_timeout_seconds and says when it ran out; the box allows its start
    margin = SANDBOX_START_SECONDS if "python" in spec.tools else 0.0
    try:
        return ToolBox(fns, timeout_seconds=spec.tool_timeout_seconds + margin)
    except ToolError as e:
        raise EnvironmentLoadError(f"{FIELD}.tools: {e}") from e


def make_environments(spec: EnvironmentSpec | None) -> Callable[[], Environment]:
    """A factory of fresh environments for trajectories of the job (types single, tools, custom)."""
    if spec is None or spec.type == "single":
        return SingleTurn
    if spec.type == "custom":
        cls: Any = load(spec.entry_point or "", f"{FIELD}.entryPoint", spec.python_path)
        if not inspect.isclass(cls) or not all(callable(getattr(cls, m, None)) for m in ("reset", "step", "tools")):
            raise EnvironmentLoadError(f"{FIELD}.entryPoint: {spec.entry_point} is not a class with reset, step "
                                       "and tools (tandem.sidecars.envs.environments.Environment)")
        kwargs, made = dict(spec.kwargs), cast(Callable[..., Environment], cls)
        try:
            made(**kwargs)  # a bad kwarg fails here, at start, not in the first rollout
        except Exception as e:  # noqa: BLE001 - the user's constructor may raise anything
            raise EnvironmentLoadError(f"{FIELD}.kwargs: {spec.entry_point}(**{kwargs}) raised "
                                       f"{type(e).__name__}: {e}") from e
        return lambda: made(**kwargs)
    if spec.type == "agent":
        raise EnvironmentLoadError(f"{FIELD}.type agent runs agent functions (agent_function), not environments")
    box = tool_box(spec)
    return lambda: ToolEnvironment(box, style=spec.tool_call_format, max_turns=spec.max_turns)


def agent_function(spec: EnvironmentSpec) -> Callable[..., Any]:
    fn = load(spec.entry_point or "", f"{FIELD}.entryPoint", spec.python_path)
    if not callable(fn) or inspect.isclass(fn):
        raise EnvironmentLoadError(f"{FIELD}.entryPoint: {spec.entry_point} is not a function")
    params = inspect.signature(fn).parameters
    takes_all = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    missing = [a for a in ("base_url", "api_key", "row", *spec.kwargs) if a not in params and not takes_all]
    if missing:
        raise EnvironmentLoadError(f"{FIELD}.entryPoint: {spec.entry_point} takes no {', '.join(missing)} "
                                   "(it is called as fn(base_url=..., api_key=..., row=..., **kwargs))")
    return fn  # type: ignore[no-any-return]


def load_environment(spec: EnvironmentSpec | None) -> Any:
    """What the rollout's driver runs: the agent function (type agent), else the environments' factory."""
    if spec is not None and spec.type == "agent":
        return agent_function(spec)
    return make_environments(spec)


def limits(spec: EnvironmentSpec | None, max_turn_tokens: int) -> Limits:
    if spec is None:
        return Limits(max_turns=1, max_turn_tokens=max_turn_tokens, max_total_tokens=max_turn_tokens)
    return Limits(max_turns=spec.max_turns, max_turn_tokens=max_turn_tokens, max_total_tokens=spec.max_total_tokens,
                  max_tool_output_tokens=spec.max_tool_output_tokens)
