"""The user's code that `rollout.environment` names (`package.module:Name`), imported with `pythonPath` searched
first, and its tool functions checked before a job starts.

Role: `load` imports a module path once and returns the object it names, or `EnvironmentLoadError` naming the
field; `tool_functions` are the job's tools as functions (the built-in `calculator` and sandboxed `python`,
the user's `package.module:function`). `tool_problems` is the check that `tandem validate` and `tandem run`
make before anything starts, as the rollout sidecar will at its start: each user tool's module imported (so
its import-time code runs here too), the function found, and made into a tool (its schema from the
docstring and annotations, its argument types checkable, not a generator; `tools.Tool.of`), each failure
one (field, message) pair naming `spec.rollout.environment.tools[i]` and the module. `missing_ok` (validate):
what does not exist on this machine is not judged, as for model directories: a tool module that is not
found while a pythonPath directory is absent here (a volume of the cluster's), or a package the module
imports that is not installed here (the image may have it). Light to import: the CLI loads it without
the rollout engine. Caller: `factory` (the rollout sidecar's environments), `tandem.cli.main`, tests.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tandem.sidecars.envs.tool_types import Signature
from tandem.sidecars.envs.tools import Tool, ToolError, calculator
from tandem.spec.environment import Environment as EnvironmentSpec

FIELD = "spec.rollout.environment"


class EnvironmentLoadError(ValueError):
    """An entryPoint or tool that cannot be imported, or is not a class/function of the right shape."""


class ModuleMissing(EnvironmentLoadError):
    """The module of a path, or a module it imports (`name`), is not installed or on pythonPath."""

    def __init__(self, message: str, name: str | None) -> None:
        super().__init__(message)
        self.name = name


def load(path: str, field: str, python_path: list[str] | None = None) -> Any:
    """The object at `package.module:Name`, importing the module with `python_path` searched first."""
    for extra in reversed(python_path or []):
        if extra not in sys.path:
            sys.path.insert(0, extra)
    module_name, _, name = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # noqa: BLE001 - the user's module may raise anything while importing
        message = (f"{field}: cannot import {module_name!r} ({type(e).__name__}: {e}); searched "
                   f"{FIELD}.pythonPath {python_path or []} and the image")
        if isinstance(e, ModuleNotFoundError):
            raise ModuleMissing(message, e.name) from e
        raise EnvironmentLoadError(message) from e
    try:
        return getattr(module, name)
    except AttributeError:
        raise EnvironmentLoadError(f"{field}: module {module_name!r} has no {name!r}") from None


def built_in_tool(name: str, spec: EnvironmentSpec) -> Callable[..., Any]:
    if name == "calculator":
        return calculator
    from tandem.sidecars.envs.python_tool import make_python_tool

    return make_python_tool(timeout_seconds=spec.tool_timeout_seconds)


def tool_functions(spec: EnvironmentSpec) -> list[Callable[..., Any]]:
    """The job's tools as functions, in the spec's order (EnvironmentLoadError naming tools[i])."""
    return [load(t, f"{FIELD}.tools[{i}]", spec.python_path) if ":" in t else built_in_tool(t, spec)
            for i, t in enumerate(spec.tools)]


def _tool(fn: Any, path: str) -> Tool | None:
    """`fn` as a tool (ToolError why not); None when transformers, which writes the schema, is not installed
    here (only the argument types are checked then)."""
    if not callable(fn):
        raise ToolError(f"{path} is a {type(fn).__name__}, not a function")
    try:
        return Tool.of(fn)
    except ImportError:  # a CLI without transformers: the rollout's image has it
        try:
            Signature.of(fn)
        except ValueError as e:
            raise ToolError(f"{getattr(fn, '__name__', path)!r} cannot be a tool: {e}") from e
        return None


def tool_problems(spec: EnvironmentSpec | None, *, missing_ok: bool) -> list[tuple[str, str]]:
    """(field, message) for each user tool of `spec` that the rollout sidecar could not load (see the module's
    docstring for `missing_ok`)."""
    if spec is None or spec.type != "tools":
        return []
    absent = [p for p in spec.python_path if not Path(p).is_dir()]
    out: list[tuple[str, str]] = []
    names: dict[str, str] = {}
    for i, path in enumerate(spec.tools):
        field = f"{FIELD}.tools[{i}]"
        if ":" not in path:
            names.setdefault(path, field)
            continue
        module_name = path.partition(":")[0]
        try:
            tool = _tool(load(path, field, spec.python_path), path)
        except ModuleMissing as e:
            own = e.name is not None and (module_name == e.name or module_name.startswith(f"{e.name}."))
            if missing_ok and (absent if own else True):
                continue  # on a volume this machine lacks, or a package the image may have
            where = f" (not here: {', '.join(absent)})" if own and absent else ""
            out.append((field, str(e).removeprefix(f"{field}: ") + where))
            continue
        except (EnvironmentLoadError, ToolError) as e:
            out.append((field, str(e).removeprefix(f"{field}: ")))
            continue
        if tool is not None and tool.name in names:
            out.append((field, f"{path} is named {tool.name!r}, as {names[tool.name]} is: tool names are unique"))
        elif tool is not None:
            names[tool.name] = field
    return out
