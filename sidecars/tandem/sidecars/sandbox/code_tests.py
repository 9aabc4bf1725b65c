"""Test formats of code datasets, read into one plan the sandbox runs; which statements count as tests.

Role: turns the dataset answer field of a `codeExec` reward into a `TestPlan`. Callers:
`runner.run_tests`, which hands `TestPlan.job(...)` to `harness.py`.

The answer field may be the value itself, its JSON text, or its Python repr (the trainer's dataset
passes non-string fields on as `str(value)`):
- test code: one string, or a list of strings (MBPP `test_list`);
- a dict of dataset columns: test code in `test` (HumanEval), `tests`, `test_list` and
  `challenge_test_list` (MBPP; all present ones run, in that order); setup code in `test_imports`
  and `test_setup_code` (runs first, never counts); `entry_point` (HumanEval: the function under
  test; `check(<entry_point>)` is added when the tests define `check` but never call it);
- I/O cases: a dict with `inputs`/`outputs` (APPS, TACO; APPS's `input_output` column holds that
  dict as JSON) or `input`/`output` (CodeContests' `public_tests`, ...), or a list of
  `{"input", "output"}` dicts (LiveCodeBench). Without `fn_name` each input is the program's
  stdin and the output its expected stdout (compared token by token, whitespace ignored); with
  `fn_name` (call-based) each input is the argument list of `fn_name(...)` (or of
  `Solution().fn_name(...)`) and the output its expected return value (or a one-element list
  holding it, as APPS writes them).

What counts as a test (each scored pass/fail; the reward is passed / total):
- a top-level `assert`;
- a top-level call of a function the test code defines (`check(f)`, `test_sorted()`);
- a top-level compound statement (`for`, `if`, `with`, `try`, ...) holding either, outside any
  nested definition;
- each I/O case.
Everything else (definitions, imports, assignments, other calls) is setup: it runs, in order, and
never counts, so `METADATA = ...; def check(candidate): ...` cannot pass a wrong program. Test code
with no test at all is an error (it would score every program that loads 1.0); an empty list or
string means "no tests" (the program only has to run).
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from typing import Any, Literal

PREFIX = "codeExec tests (dataset answer field)"
CODE_KEYS = ("test", "tests", "test_list", "challenge_test_list")
SETUP_KEYS = ("test_imports", "test_setup_code")
IO_KEYS = (("inputs", "outputs"), ("input", "output"))
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
_SETUP_STATEMENTS = (*_SCOPES, ast.Import, ast.ImportFrom, ast.Assign, ast.AugAssign, ast.AnnAssign)


class TestFormatError(ValueError):
    """The answer field is not a test format this module reads (the message names what is wrong)."""

    __test__ = False  # not a pytest test class


@dataclass(frozen=True)
class Source:
    name: str  # where it came from, e.g. "test_list[1]" (tracebacks and errors)
    code: str
    counted: tuple[int, ...]  # indices of its top-level statements that are tests


@dataclass(frozen=True)
class IOCase:
    input: Any  # stdin text, or the argument list (call-based)
    output: Any  # expected stdout text, or the expected return value


@dataclass(frozen=True)
class TestPlan:
    __test__ = False  # not a pytest test class

    sources: tuple[Source, ...] = ()
    cases: tuple[IOCase, ...] = ()
    fn_name: str | None = None  # call-based I/O cases

    @property
    def kind(self) -> Literal["snippets", "stdio", "call"]:
        if not self.cases:
            return "snippets"
        return "stdio" if self.fn_name is None else "call"

    @property
    def total(self) -> int:
        return len(self.cases) if self.cases else sum(len(s.counted) for s in self.sources)

    def to_json(self) -> dict[str, Any]:
        """The plan as JSON (what a trainer sends the sandbox server); `from_json` reads it back."""
        return {"sources": [[x.name, x.code, list(x.counted)] for x in self.sources],
                "cases": [[c.input, c.output] for c in self.cases], "fn_name": self.fn_name}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TestPlan:
        return cls(sources=tuple(Source(str(n), str(c), tuple(map(int, k))) for n, c, k in data["sources"]),
                   cases=tuple(IOCase(i, o) for i, o in data["cases"]), fn_name=data.get("fn_name"))

    def job(self, case_seconds: float) -> dict[str, Any]:
        """The harness's `tests` entry (JSON-serialisable)."""
        if self.kind == "snippets":
            return {"kind": "snippets", "sources": [
                {"name": s.name, "code": s.code, "counted": list(s.counted)} for s in self.sources]}
        return {"kind": self.kind, "fn_name": self.fn_name, "case_seconds": case_seconds,
                "cases": [{"input": c.input, "output": c.output} for c in self.cases]}


def _decode(value: object) -> object:
    """A list or dict written as JSON or as a Python literal becomes that value; anything else is kept."""
    if not isinstance(value, str) or value.strip()[:1] not in ("[", "{"):
        return value
    text = value.strip()
    try:
        loaded: object = json.loads(text)
    except json.JSONDecodeError:
        try:
            loaded = ast.literal_eval(text)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return value
    return loaded if isinstance(loaded, list | dict) else value


def _walk(node: ast.AST) -> list[ast.AST]:
    """`node` and everything inside it, except the insides of nested functions, classes and lambdas."""
    out, stack = [], [node]
    while stack:
        n = stack.pop()
        out.append(n)
        stack.extend(c for c in ast.iter_child_nodes(n) if not isinstance(c, _SCOPES))
    return out


def _calls(node: ast.AST, names: set[str]) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) \
        and isinstance(node.value.func, ast.Name) and node.value.func.id in names


def is_test(node: ast.stmt, test_functions: set[str]) -> bool:
    """Whether a top-level statement is a test (see the module docstring)."""
    if isinstance(node, _SETUP_STATEMENTS):
        return False
    return any(isinstance(n, ast.Assert) or _calls(n, test_functions) for n in _walk(node))


def _snippets(named: list[tuple[str, str, bool]], entry_point: str | None) -> TestPlan:
    """Plan for test code: (name, code, is_setup) in run order."""
    trees: list[ast.Module] = []
    for name, code, _ in named:
        try:
            trees.append(ast.parse(code, filename=name))
        except SyntaxError as e:
            raise TestFormatError(f"{PREFIX}: {name} is not valid Python: {e.msg} (line {e.lineno})") from None
    defined = {n.name for t in trees for n in t.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    sources = [Source(name, code, () if setup else tuple(i for i, n in enumerate(t.body) if is_test(n, defined)))
               for (name, code, setup), t in zip(named, trees, strict=True)]
    if entry_point is not None and "check" in defined:
        called = any(_calls(n, {"check"}) for t in trees for stmt in t.body for n in _walk(stmt))
        if not called:
            sources.append(Source("entry_point", f"check({entry_point})", (0,)))
    plan = TestPlan(sources=tuple(sources))
    has_code = any(t.body for t, (_, _, setup) in zip(trees, named, strict=True) if not setup)
    if plan.total == 0 and has_code:
        hint = (" The tests define check(candidate) but nothing names the function to check: give "
                "{'test': ..., 'entry_point': '<function>'}." if "check" in defined else "")
        raise TestFormatError(f"{PREFIX}: no test found: a test is an assert, a call of a function the "
                              f"tests define (check(f)) or an I/O case; definitions, imports and "
                              f"assignments are setup.{hint}")
    return plan


def _code_list(value: object, key: str) -> list[tuple[str, str]]:
    value = _decode(value)
    if isinstance(value, str):
        return [(key, value)]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return [(f"{key}[{i}]", v) for i, v in enumerate(value)]
    raise TestFormatError(f"{PREFIX}: {key} must be test code (a string or a list of strings), "
                          f"got {type(value).__name__}")


def _identifier(d: dict[str, Any], key: str) -> str | None:
    value = d.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str) or not value.isidentifier():
        raise TestFormatError(f"{PREFIX}: {key} must be a Python function name, got {value!r}")
    return value


def _text(value: object) -> str:
    if isinstance(value, list):
        return "\n".join(str(v) for v in value)
    return str(value)


def _io(d: dict[str, Any], keys: tuple[str, str], fn_name: str | None) -> TestPlan:
    ins, outs = (_decode(d[k]) for k in keys)
    if not isinstance(ins, list) or not isinstance(outs, list):
        raise TestFormatError(f"{PREFIX}: {keys[0]} and {keys[1]} must be lists")
    if len(ins) != len(outs):
        raise TestFormatError(f"{PREFIX}: {keys[0]} has {len(ins)} items but {keys[1]} has {len(outs)}")
    if not ins:
        raise TestFormatError(f"{PREFIX}: {keys[0]} is empty")
    if fn_name is None:
        cases = [IOCase(_text(i), _text(o)) for i, o in zip(ins, outs, strict=True)]
    else:
        cases = [IOCase(i if isinstance(i, list) else [i], o) for i, o in zip(ins, outs, strict=True)]
    return TestPlan(cases=tuple(cases), fn_name=fn_name)


def _from_dict(d: dict[str, Any]) -> TestPlan:
    if "input_output" in d:
        inner = _decode(d["input_output"])
        if not isinstance(inner, dict):
            raise TestFormatError(f"{PREFIX}: input_output must be a dict (or its JSON) of inputs and outputs")
        d = {**{k: v for k, v in d.items() if k != "input_output"}, **inner}
    fn_name = _identifier(d, "fn_name")
    io_keys = next((k for k in IO_KEYS if k[0] in d and k[1] in d), None)
    code_keys = [k for k in CODE_KEYS if k in d]
    if io_keys is not None and code_keys:
        raise TestFormatError(f"{PREFIX}: give either I/O cases ({'/'.join(io_keys)}) or test code "
                              f"({', '.join(code_keys)}), not both")
    if io_keys is not None:
        return _io(d, io_keys, fn_name)
    if not code_keys:
        accepted = ", ".join([*CODE_KEYS, "inputs/outputs", "input/output", "input_output"])
        raise TestFormatError(f"{PREFIX}: a dict needs one of {accepted}; got keys {sorted(d)}")
    named = [(n, c, True) for k in SETUP_KEYS if d.get(k) for n, c in _code_list(d[k], k)]
    named += [(n, c, False) for k in code_keys for n, c in _code_list(d[k], k)]
    return _snippets(named, _identifier(d, "entry_point"))


def parse_tests(answer: object) -> TestPlan:
    """The test plan of a dataset answer field (see the module docstring); TestFormatError if unreadable."""
    value = _decode(answer)
    if value is None:
        raise TestFormatError(f"{PREFIX}: missing (the row has no tests)")
    if isinstance(value, dict):
        return _from_dict(value)
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        keys = ("input", "output")
        if not all(k in v for v in value for k in keys):
            raise TestFormatError(f"{PREFIX}: a list of dicts must hold I/O cases with input and output")
        return _io({k: [v[k] for v in value] for k in keys}, keys, None)
    if isinstance(value, str | list):
        return _snippets([(n, c, False) for n, c in _code_list(value, "tests")], None)
    raise TestFormatError(f"{PREFIX}: expected test code, a dict of test columns or I/O cases, "
                          f"got {type(value).__name__}")
