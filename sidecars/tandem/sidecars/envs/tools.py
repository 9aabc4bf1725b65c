"""Python functions as the model's tools: their schemas, and running calls safely beside the engine loop.

Role: a `Tool` is a function whose signature and Google-style docstring become the JSON schema that the
chat template renders (transformers' `get_json_schema`: a tool without a docstring or with an untyped
argument is refused when the tool is made, naming it), and whose annotations check each call's arguments
(`tool_types.Signature`: strict, a wrong type is an error message to the model, never coerced). `ToolBox.run`
executes a call within a per-call timeout and caps what comes back, so a slow tool never blocks the rollout's
loop and every failure (an unknown tool, bad arguments, an exception, a timeout, a result JSON cannot hold)
becomes a message to the model; a result that is not a string is sent as JSON (`tool_types.as_text`), but a
picture (a PIL image, or a list of them), which comes back as the tool message's image parts.
Plain functions run in a bounded thread pool; a timed-out call's thread cannot be killed and keeps its
worker until it returns, which the pool's bound contains (tools that may run away belong in a process: the
sandbox). `async def` tools (and plain functions that return an awaitable, such as a decorator's wrapper)
are awaited on the box's one event loop, in a thread of its own, so async clients a module keeps work across
calls; a timed-out one is cancelled. Built in: `calculator`. Caller: `environments.ToolEnvironment`, `factory`.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import operator
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from tandem.sidecars.envs.tool_types import BadArguments, Signature, as_text
from tandem.sidecars.envs.toolcalls import ToolCall


class ToolError(ValueError):
    """A function cannot be a tool (no docstring, an argument without a type, a duplicate name)."""


def is_async(fn: Callable[..., Any]) -> bool:
    """Whether calling `fn` gives a coroutine to await (`async def`, a partial of one, or an object whose
    `__call__` is one)."""
    return inspect.iscoroutinefunction(fn) or (not inspect.isroutine(fn) and
                                                inspect.iscoroutinefunction(type(fn).__call__))


@dataclass(frozen=True)
class Tool:
    name: str
    schema: dict[str, Any]  # {"type": "function", "function": {name, description, parameters}}
    fn: Callable[..., Any]
    signature: Signature
    awaited: bool  # an async function: its calls run on the box's event loop

    @classmethod
    def of(cls, fn: Callable[..., Any]) -> Tool:
        from transformers.utils import get_json_schema

        label = repr(getattr(fn, "__name__", fn))
        try:
            signature = Signature.of(fn)
        except ValueError as e:
            raise ToolError(f"{label} cannot be a tool: {e}") from e
        try:
            schema = get_json_schema(fn)
        except Exception as e:  # noqa: BLE001 - transformers raises its own DocstringParsingException & co
            raise ToolError(f"{label} cannot be a tool: {e}") from e
        return cls(schema["function"]["name"], schema, fn, signature, is_async(fn))


@dataclass(frozen=True)
class ToolResult:
    name: str
    content: str
    error: bool
    seconds: float
    pictures: tuple[Any, ...] = ()  # a tool that returned a picture (or a list of them): sent as image parts


def pictures_in(value: Any) -> tuple[Any, ...]:
    """The pictures a tool returned: a PIL image, or a non-empty list or tuple of them; () for anything else."""
    from PIL import Image

    if isinstance(value, Image.Image):
        return (value,)
    if isinstance(value, list | tuple) and value and all(isinstance(v, Image.Image) for v in value):
        return tuple(value)
    return ()


async def _awaited(fn: Callable[..., Any], arguments: Mapping[str, Any]) -> Any:
    value = fn(**arguments)
    return await value if inspect.isawaitable(value) else value


async def _await(value: Awaitable[Any]) -> Any:
    return await value


def _serve(loop: asyncio.AbstractEventLoop) -> None:
    """Run `loop` until stopped; then cancel what still runs on it and close it."""
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        left = asyncio.all_tasks(loop)
        for task in left:
            task.cancel()
        loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


class EventLoop:
    """One asyncio loop in a daemon thread, started on first use; coroutines from any thread run on it."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def submit(self, coroutine: Coroutine[Any, Any, Any]) -> Future[Any]:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=_serve, args=(loop,), name="tool-loop", daemon=True).start()
                self._loop = loop
            return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    def close(self) -> None:
        with self._lock:
            loop, self._loop = self._loop, None
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)


class ToolBox:
    """Tools by name, plain ones run `workers` at a time and async ones on one event loop, each call within
    `timeout_seconds`, answers cut to `max_output_chars`."""

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
        self._loop = EventLoop()

    def schemas(self) -> list[dict[str, Any]]:
        return [t.schema for t in self.tools.values()]

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._loop.close()

    def _cap(self, text: str) -> str:
        if len(text) <= self.max_output_chars:
            return text
        return text[:self.max_output_chars] + f"... [{len(text) - self.max_output_chars} more characters cut]"

    def _value(self, tool: Tool, arguments: dict[str, Any], deadline: float) -> Any:
        """The call's value, awaited if it is awaitable; TimeoutError past `deadline` (the call cancelled)."""
        def wait(future: Future[Any]) -> Any:
            try:
                return future.result(timeout=max(deadline - time.perf_counter(), 0.0))
            except TimeoutError:
                future.cancel()  # an async call's task is cancelled; a thread runs on until it returns
                raise

        if tool.awaited:
            return wait(self._loop.submit(_awaited(tool.fn, arguments)))
        value = wait(self._pool.submit(tool.fn, **arguments))
        if inspect.isawaitable(value):  # a plain function that returned a coroutine (a decorator's wrapper)
            value = wait(self._loop.submit(_await(value)))
        return value

    def run(self, call: ToolCall) -> ToolResult:
        start = time.perf_counter()

        def answer(text: str, error: bool) -> ToolResult:  # what the tool wrote is cut to max_output_chars
            return ToolResult(call.name, text, error, time.perf_counter() - start)

        tool = self.tools.get(call.name)
        if tool is None:
            return answer(f"error: no tool named {call.name!r} (tools: {', '.join(sorted(self.tools)) or 'none'})",
                          True)
        try:
            arguments = tool.signature.check(call.arguments)
        except BadArguments as e:
            return answer(f"error: bad arguments for {call.name}: {e}", True)
        try:
            value = self._value(tool, arguments, start + self.timeout_seconds)
        except TimeoutError:
            return answer(f"error: {call.name} timed out after {self.timeout_seconds:g} s", True)
        except Exception as e:  # noqa: BLE001 - the tool's failure is the model's information, not ours
            return answer(f"error: {call.name} raised {type(e).__name__}: {self._cap(str(e))}", True)
        pictures = pictures_in(value)
        if pictures:  # (a vision-language model sees them; a text model's driver refuses them, and says so)
            return ToolResult(call.name, "", False, time.perf_counter() - start, pictures)
        try:
            text = as_text(value)
        except ValueError as e:
            return answer(f"error: {call.name} {e}", True)
        return answer(self._cap(text), False)


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
