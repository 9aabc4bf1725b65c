"""Parse and validate RLHFJob documents offline, with errors that name the offending field.

Callers: `tandem validate` / `tandem run` (files) and the operator (the `spec` dict of a live object).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from tandem.spec.models import RLHFJob


class SpecError(ValueError):
    """An invalid job. `problems` holds (field path, message) pairs; str() lists them all."""

    def __init__(self, source: str, problems: list[tuple[str, str]]):
        self.source = source
        self.problems = problems
        lines = "\n".join(f"  {path}: {msg}" for path, msg in problems)
        super().__init__(f"{source}: invalid RLHFJob\n{lines}")

    @property
    def fields(self) -> list[str]:
        return [p for p, _ in self.problems]


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
        return RLHFJob.model_validate(doc)
    except ValidationError as e:
        raise SpecError(source, _problems(e)) from None


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
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as e:
        raise SpecError(str(p), [("<yaml>", str(e).replace("\n", " "))]) from None
    if len(docs) != 1:
        raise SpecError(str(p), [("<root>", f"expected exactly one document, found {len(docs)}")])
    return parse_job(resolve_paths(docs[0], p.resolve().parent), str(p))


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
