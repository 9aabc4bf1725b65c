"""What crosses between the model and a tool function: its arguments, checked against the types of its
signature, and its result, written as JSON.

Role: `Signature.of(fn)` reads the parameters the tool's schema is made from (transformers' get_json_schema
reads the same annotations) and builds a pydantic validator of them, strict and in JSON mode, so an argument
must be of the schema's type and is never coerced: a list is no string, "no" no boolean, 2.0 no integer; as
JSON allows, an integer is a number, an array fills a tuple, a string a date or an enum's value.
`Signature.check(arguments)` gives the keyword arguments to call the function with (tuples, enums and dates
made), or raises `BadArguments`, whose text is the model's error message: unknown and missing names, then
each wrong value with its place, what was wanted and what came. A function whose parameters cannot be sent
by name (*args, **kwargs, positional-only), whose types cannot be resolved or checked, or that yields
instead of returning is refused at load (`ValueError`, which `tools.Tool.of` names). `as_text(value)` is
what the model reads of a result: a string as it is, anything else as JSON (pydantic's encoder: dicts,
lists, numbers, None, and dataclasses, models, tuples, dates too); a value JSON cannot hold is an error.
Caller: `tools.Tool` and `tools.ToolBox`.
"""

from __future__ import annotations

import inspect
import json
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NotRequired, Required

from pydantic import ConfigDict, PydanticSchemaGenerationError, PydanticUserError, TypeAdapter, ValidationError
from pydantic_core import PydanticSerializationError, to_json
from typing_extensions import TypedDict  # pydantic reads typing's own only from Python 3.12

NAMED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
SHOWN = 60  # characters of a wrong value quoted back to the model


class BadArguments(ValueError):
    """Arguments the function cannot take; str() is the model's error message (without the tool's name)."""


def json_type(value: Any) -> str:
    """The JSON name of a parsed JSON value's type (what the model sent)."""
    if value is None:
        return "null"
    for kind, name in ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"), (list, "array"),
                       (dict, "object")):
        if isinstance(value, kind):
            return name
    return type(value).__name__


def _place(loc: tuple[int | str, ...]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else str(p)) for i, p in enumerate(loc))


def _hints(fn: Callable[..., Any]) -> dict[str, Any]:
    """The resolved annotations of `fn` (`from __future__ import annotations` writes them as strings)."""
    target = fn if inspect.isfunction(fn) or inspect.ismethod(fn) else getattr(fn, "func", type(fn).__call__)
    try:
        return typing.get_type_hints(target, include_extras=True)
    except Exception as e:  # noqa: BLE001 - a name the annotation uses may be missing, or anything else
        raise ValueError(f"its annotations cannot be resolved ({type(e).__name__}: {e})") from e


@dataclass(frozen=True)
class Signature:
    """The named parameters of a tool function and a strict validator of the JSON arguments a call sends."""

    names: tuple[str, ...]
    required: frozenset[str]
    adapter: TypeAdapter[Any]

    @classmethod
    def of(cls, fn: Callable[..., Any]) -> Signature:
        if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
            raise ValueError("it yields; a tool returns its answer (return it, or a list of the parts)")
        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError) as e:
            raise ValueError(f"its signature cannot be read ({e})") from e
        odd = [("*" if p.kind is p.VAR_POSITIONAL else "**" if p.kind is p.VAR_KEYWORD else "") + name
               for name, p in params.items() if p.kind not in NAMED]
        if odd:
            raise ValueError(f"{', '.join(odd)} cannot be sent by name (a tool's arguments are a JSON object: "
                             "give each parameter a name and a type)")
        hints = _hints(fn)
        untyped = [name for name in params if name not in hints]
        if untyped:
            raise ValueError(f"{', '.join(untyped)} has no type annotation")
        fields = {name: (Required if p.default is p.empty else NotRequired)[hints[name]] for name, p in params.items()}
        typed_dict: Any = TypedDict  # made at run time, from the signature (mypy reads class statements only)
        shape = typed_dict(f"{getattr(fn, '__name__', 'tool')}_arguments", fields)
        shape.__pydantic_config__ = ConfigDict(strict=True, extra="forbid")
        try:
            adapter: TypeAdapter[Any] = TypeAdapter(shape)
        except (PydanticSchemaGenerationError, PydanticUserError) as e:
            raise ValueError(f"its argument types cannot be checked ({str(e).splitlines()[0]})") from e
        required = frozenset(name for name, p in params.items() if p.default is p.empty)
        return cls(tuple(params), required, adapter)

    def check(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """The keyword arguments for the function, or BadArguments saying what is wrong with `arguments`."""
        unknown = sorted(set(arguments) - set(self.names))
        missing = sorted(self.required - set(arguments))
        if unknown or missing:
            raise BadArguments("; ".join(([f"unknown {', '.join(unknown)}"] if unknown else []) +
                                         ([f"missing {', '.join(missing)}"] if missing else [])))
        try:
            text = json.dumps(dict(arguments), allow_nan=False)
        except (TypeError, ValueError) as e:
            raise BadArguments(f"the arguments are not JSON ({e})") from e
        try:
            return dict(self.adapter.validate_json(text))
        except ValidationError as e:
            raise BadArguments("; ".join(
                f"{_place(err['loc'])}: {err['msg']} (got {json_type(err['input'])} "
                f"{json.dumps(err['input'], default=str)[:SHOWN]})" for err in e.errors(include_url=False))) from None


def as_text(value: Any) -> str:
    """What the model reads of a tool's result: a string as it is, anything else as JSON (ValueError when
    JSON cannot hold it, naming its type)."""
    if isinstance(value, str):
        return value
    try:
        return to_json(value).decode()
    except PydanticSerializationError:
        raise ValueError(f"returned a value of type {type(value).__name__}, which JSON cannot hold (return a str, "
                         "or a dict, list, number or bool)") from None
