"""Python functions as the model's tools: their schemas, and running calls safely beside the engine loop.

Role: a `Tool` is a function whose signature and Google-style docstring become the JSON schema that the
chat template renders (transformers' `get_json_schema`: a tool without a docstring or with an untyped
argument is refused when the tool is made, naming it). `ToolBox.run` executes a call in a bounded thread
pool with a per-call timeout and caps what comes back, so a slow tool never blocks the rollout's loop and
every failure (an unknown tool, bad arguments, an exception, a timeout) becomes a message to the model.
A timed-out call's thread cannot be killed; it keeps its worker until it returns, which the pool's bound
contains (tools that may run away belong in a process: the sandbox). Built in: `calculator`.
Caller: `base.ToolEnvironment`.
"""

from __future__ import annotations

import ast
import operator
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

from tandem.sidecars.envs.toolcalls import ToolCall


class ToolError(ValueError):
    """A function cannot be a tool (no docstring, an argument without a type, a duplicate name)."""


@dataclass(frozen=True)
class Tool:
    name: str
    schema: dict[str, Any]  # {"type": "function", "function": {name, description, parameters}}
    fn: Callable[..., Any]

    @classmethod
    def of(cls, fn: Callable[..., Any]) -> Tool:
        from transformers.utils import get_json_schema

        try:
            schema = get_json_schema(fn)
        except Exception as e:  # noqa: BLE001 - transformers raises its own DocstringParsingException & co
            raise ToolError(f"{getattr(fn, '__name__', fn)!r} cannot be a tool: {e}") from e
        return cls(schema["function"]["name"], schema, fn)


@dataclass(frozen=True)
class ToolResult:
    name: str
    content: str
    error: bool
    seconds: float


class ToolBox:
    """Tools by name, run `workers` at a time, each call within `timeout_seconds`, answers cut to
    `max_output_chars`."""

    def __init__(self, tools: Iterable[Tool | Callable[..., Any]], *, workers: int = 4, timeout_seconds: float = 10.0,
                 max_output_chars: int = 2000) -> None:
        self.tools: dict[str, Tool] = {}
        for t in tools:
            tool = t if isinstance(t, Tool) else Tool.of(t)
            if tool.name in self.tools:
                raise ToolError(f"two tools are named {tool.name!r}")
            self.tools[tool.name] = tool
        self.timeout_seconds, self.max_output_chars = timeout_seconds, max_output_chars
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tool")

    def schemas(self) -> list[dict[str, Any]]:
        return [t.schema for t in self.tools.values()]

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _cap(self, text: str) -> str:
        if len(text) <= self.max_output_chars:
            return text
        return text[:self.max_output_chars] + f"... [{len(text) - self.max_output_chars} more characters cut]"

    def run(self, call: ToolCall) -> ToolResult:
        start = time.perf_counter()

        def answer(text: str, error: bool) -> ToolResult:  # what the tool wrote is cut to max_output_chars
            return ToolResult(call.name, text, error, time.perf_counter() - start)

        tool = self.tools.get(call.name)
        if tool is None:
            return answer(f"error: no tool named {call.name!r} (tools: {', '.join(sorted(self.tools)) or 'none'})",
                          True)
        wanted = tool.schema["function"]["parameters"]
        unknown = sorted(set(call.arguments) - set(wanted.get("properties", {})))
        missing = sorted(set(wanted.get("required", [])) - set(call.arguments))
        if unknown or missing:
            return answer(f"error: bad arguments for {call.name}: " + "; ".join(
                ([f"unknown {', '.join(unknown)}"] if unknown else []) + ([f"missing {', '.join(missing)}"]
                                                                          if missing else [])), True)
        future = self._pool.submit(tool.fn, **call.arguments)
        try:
            value = future.result(timeout=self.timeout_seconds)
        except FutureTimeout:
            future.cancel()
            return answer(f"error: {call.name} timed out after {self.timeout_seconds:g} s", True)
        except Exception as e:  # noqa: BLE001 - the tool's failure is the model's information, not ours
            return answer(f"error: {call.name} raised {type(e).__name__}: {self._cap(str(e))}", True)
        return answer(self._cap(value if isinstance(value, str) else str(value)), False)


_OPS: dict[type[ast.AST], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}
MAX_EXPONENT = 1000
MAX_DIGITS = 4300  # Python's own limit on int <-> str conversion


def _bits(left: int, right: int, op: ast.operator) -> int:
    """An upper bound on the bits of `left op right`, found before computing it."""
    if isinstance(op, ast.Pow):
        return left.bit_length() * max(right, 0)
    return left.bit_length() + right.bit_length()


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd | ast.USub):
        value = _eval(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ValueError(f"exponent {right} is larger than {MAX_EXPONENT}")
        if isinstance(node.op, ast.Pow | ast.Mult) and isinstance(left, int) and isinstance(right, int) and \
                _bits(left, right, node.op) > MAX_DIGITS * 4:
            raise ValueError("the result is too large")
        result = _OPS[type(node.op)](left, right)
        return result  # type: ignore[no-any-return]
    raise ValueError(f"only numbers and + - * / // % ** ( ) are allowed, not {ast.unparse(node)!r}")


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly (integers stay integers).

    Args:
        expression: Numbers combined with + - * / // % ** and parentheses, e.g. "(123 + 4) * 56".
    """
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as e:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from e
    value = _eval(tree.body)
    return repr(value) if isinstance(value, float) else str(value)
