"""Parse and validate RLHFJob documents offline, with errors that name the offending field.

Role: the offline half of the one contract with the API server: numbers are read as the API server
gets them from kubectl (an integral float such as 8.0 is the integer 8: kubectl's YAML-to-JSON writes
it so), types are strict as the CRD's, and a YAML error names file, line and column
(with the fix for its most common cause, an unquoted value starting with `[` or `{`).
Callers: `tandem validate` / `tandem run` (files) and the operator (the `spec` dict of a live object).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from tandem.spec.models import RLHFJob


class SpecError(ValueError):
    """An invalid job. `problems` holds (field path, message) pairs; str() lists them all."""

    def __init__(self, source: str, problems: list[tuple[str, str]], title: str = "invalid RLHFJob"):
        self.source = source
        self.problems = problems
        lines = "\n".join(f"  {path}: {msg}" for path, msg in problems)
        super().__init__(f"{source}: {title}\n{lines}")

    @property
    def fields(self) -> list[str]:
        return [p for p, _ in self.problems]


_TYPES = {"int_type": "number", "float_type": "number", "bool_type": "true or false"}


def _problems(err: ValidationError) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"])
        msg = str(e["msg"])
        if e["type"] == "value_error":
            msg = msg.removeprefix("Value error, ")
            head, sep, tail = msg.partition(": ")
            if sep and " " not in head:  # a Rule or validator naming a relative field
                loc, msg = f"{loc}.{head}" if loc else head, tail
        elif e["type"] in _TYPES and isinstance(e.get("input"), str):  # "8" for 8: the API server refuses it too
            msg = f"{msg}: {e['input']!r} is quoted text; write the {_TYPES[e['type']]} without quotes"
        elif e["type"] == "missing":
            msg = "required field is missing"
        elif e["type"] == "extra_forbidden":
            msg = "unknown field"
        out.append((loc or "<root>", msg))
    return out


def parse_job(doc: Any, source: str = "<job>") -> RLHFJob:
    """Validate one RLHFJob document (a dict); raise SpecError naming each bad field."""
    if not isinstance(doc, dict):
        raise SpecError(source, [("<root>", f"expected a mapping, got {type(doc).__name__}")])
    try:
        return RLHFJob.model_validate(as_kubectl_sends(doc))
    except ValidationError as e:
        raise SpecError(source, _problems(e)) from None


def as_kubectl_sends(value: Any) -> Any:
    """`value` with every integral float (8.0) as its integer (8), as kubectl sends a job file to the API server
    (sigs.k8s.io/yaml writes the float 8.0 as 8): its integers then take it and its numbers take 8 too."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, dict):
        return {k: as_kubectl_sends(v) for k, v in value.items()}
    if isinstance(value, list):
        return [as_kubectl_sends(v) for v in value]
    return value


def parse_spec(spec: Any, name: str = "job", source: str = "<spec>") -> RLHFJob:
    """Validate a bare `spec` mapping, as the operator receives it."""
    return parse_job({"apiVersion": "tandem.dev/v1alpha1", "kind": "RLHFJob", "metadata": {"name": name},
                      "spec": spec}, source)


def load_job(path: str | Path) -> RLHFJob:
    """Read a YAML file holding one RLHFJob; relative model/dataset paths resolve against its folder."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise SpecError(str(p), [("<file>", e.strerror or str(e))]) from None
    except UnicodeDecodeError as e:
        raise SpecError(str(p), [("<file>", f"not UTF-8 text ({e.reason} at byte {e.start})")]) from None
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as e:
        raise yaml_error(str(p), text, e) from None
    if len(docs) != 1:
        raise SpecError(str(p), [("<root>", f"expected exactly one document, found {len(docs)}")])
    return parse_job(resolve_paths(docs[0], p.resolve().parent), str(p))


_FLOW_START = re.compile(r"^\s*(-\s+)?([^\s#'\"][^:#]*:\s+)?[\[{]")  # a value opening a YAML list or map


def yaml_error(source: str, text: str, err: yaml.YAMLError) -> SpecError:
    """A YAML syntax error as a SpecError whose source is file:line:column (1-based), the offending line
    quoted, and the fix where a value starts with [ or { (read as a list or mapping: `[INST] ...`)."""
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None) or str(err).replace("\n", " ")
    context, context_mark = getattr(err, "context", None), getattr(err, "context_mark", None)
    if mark is None:
        return SpecError(source, [("<yaml>", problem)], "not valid YAML")
    lines = text.splitlines()
    rows = sorted({m.line for m in (mark, context_mark) if m is not None and m.line < len(lines)})
    msg = f"{problem} (line {mark.line + 1}, column {mark.column + 1}"
    msg += f"; {context} at line {context_mark.line + 1}, column {context_mark.column + 1})" if context and \
        context_mark else ")"
    msg += "".join(f"\n    {r + 1} | {lines[r]}" for r in rows)
    if any(_FLOW_START.match(lines[r]) for r in rows):
        msg += ("\n    a value that starts with [ or { is a YAML list or mapping: quote text such as "
                "'[INST] ... [/INST]'")
    return SpecError(f"{source}:{mark.line + 1}:{mark.column + 1}", [("<yaml>", msg)], "not valid YAML")


# Fields naming files of the job (dotted paths under `spec`) that a job file may give relative to itself.
RELATIVE_PATHS = ("model.path", "dataset.path", "reference.path", "eval.dataset.path", "algorithm.distillation.teacher",
                  "rollout.environment.pythonPath")  # a list of directories


def resolve_paths(doc: Any, base: Path) -> Any:
    """`doc` with the relative paths of RELATIVE_PATHS made absolute against `base`, before validation
    (so checks that read the files, like model.family against config.json, see the real ones)."""
    spec = doc.get("spec") if isinstance(doc, dict) else None
    for dotted in RELATIVE_PATHS:
        *parents, leaf = dotted.split(".")
        node = spec
        for key in parents:
            node = node.get(key) if isinstance(node, dict) else None
        value = node.get(leaf) if isinstance(node, dict) else None
        if isinstance(node, dict) and isinstance(value, str) and value and not value.startswith("/"):
            node[leaf] = str(base / value)
        elif isinstance(node, dict) and isinstance(value, list):
            node[leaf] = [str(base / v) if isinstance(v, str) and v and not v.startswith("/") else v for v in value]
    return doc
