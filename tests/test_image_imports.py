"""Every image can import what its entry point imports.

For each Dockerfile: the module its ENTRYPOINT runs (`python -m tandem.…`), every Tandem module
reachable from it through `import` statements (read with `ast`, function bodies included), and the
third-party top-level modules those import. Each must come from a distribution that the image's
requirement files name (Dockerfile.operator: pyproject's dependencies and its `operator` extra) or
from one of their declared dependencies, followed transitively through this venv's metadata
(`importlib.metadata.packages_distributions()` + `requires()`). A CUDA build the venv lacks (vllm,
Mooncake) is read through its CPU twin, which declares the same dependencies.
Not counted: imports under `if TYPE_CHECKING:` and imports inside a `try` that catches ImportError
(optional by construction), and the few in `ABSENT_ON_PURPOSE`, each with the reason.
"""

from __future__ import annotations

import ast
import json
import sys
import tomllib
from functools import cache
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from test_versions import CPU_TWIN, IMAGES, ROOT, instructions, name, requirements

TANDEM_ROOTS = [ROOT / r for r in ("spec", "operator", "sidecars", "checkpoint_engine")]
ABSENT_ON_PURPOSE: dict[str, set[str]] = {}


def tandem_file(module: str) -> Path | None:
    """The source file of a Tandem module, None for a name inside a module (a class, a function)."""
    for root in TANDEM_ROOTS:
        path = root.joinpath(*module.split("."))
        if (path / "__init__.py").is_file():
            return path / "__init__.py"
        if path.with_suffix(".py").is_file():
            return path.with_suffix(".py")
    return None


def _optional(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    """Inside `if TYPE_CHECKING:` or a `try` whose handlers catch ImportError (or broader)."""
    child, parent = node, parents.get(node)
    while parent is not None:
        if isinstance(parent, ast.If) and child in parent.body and "TYPE_CHECKING" in ast.unparse(parent.test):
            return True
        if isinstance(parent, ast.Try) and child in parent.body:
            caught = {n.id for h in parent.handlers if h.type is not None for n in ast.walk(h.type)
                      if isinstance(n, ast.Name)}
            if caught & {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}:
                return True
        child, parent = parent, parents.get(parent)
    return False


def imported(module: str, path: Path) -> set[str]:
    """Dotted names this module imports at some point (`from a import b` gives a and a.b)."""
    tree = ast.parse(path.read_text(), str(path))
    parents = {c: p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Import | ast.ImportFrom) or _optional(node, parents):
            continue
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
            continue
        base = node.module or ""
        if node.level:
            parts = package.split(".")
            base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
        names |= {base} | {f"{base}.{a.name}" for a in node.names}
    return names


def third_party_imports(entry: str) -> dict[str, str]:
    """{top-level module: a Tandem module importing it} over everything reachable from `entry`."""
    seen: set[str] = set()
    todo, found = [entry], {}
    while todo:
        module = todo.pop()
        path = tandem_file(module)
        if module in seen or path is None:
            continue
        seen.add(module)
        for name_ in imported(module, path):
            top = name_.split(".")[0]
            if top == "tandem":
                todo.append(name_)
            elif top not in sys.stdlib_module_names and top != "__future__":
                found.setdefault(top, module)
    assert len(seen) > 5, f"{entry}: found only {sorted(seen)}"
    return found


@cache
def _dists_of_modules() -> dict[str, list[str]]:
    return metadata.packages_distributions()


def provided(reqs: list[Requirement]) -> set[str]:
    """Top-level modules of these distributions and everything they declare, transitively."""
    todo, dists = [(r, True) for r in reqs], set[str]()
    while todo:
        req, direct = todo.pop()
        key = CPU_TWIN.get(name(req), name(req))
        if key in dists:
            continue
        try:
            declared = metadata.requires(key) or []
        except metadata.PackageNotFoundError:
            if direct:
                pytest.fail(f"{key} (named by the image's requirements) is not installed here: "
                            "run scripts/setup.sh python")
            continue  # e.g. vLLM's torchvision, which the CPU venv leaves out: provides nothing imported here
        dists.add(key)
        extras = req.extras | {""}
        for line in declared:
            dep = Requirement(line)
            if dep.marker is None or any(dep.marker.evaluate({"extra": e}) for e in extras):
                todo.append((dep, False))
    return {module for module, owners in _dists_of_modules().items()
            if any(name(Requirement(o)) in dists for o in owners)}


def image_requirements(dockerfile: str) -> list[Requirement]:
    if dockerfile in IMAGES:
        return [r for f in IMAGES[dockerfile] for r in requirements(f).values()]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert any(".[operator]" in args for op, args in instructions(dockerfile) if op == "RUN"), dockerfile
    return [Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["operator"]]


def entry_module(dockerfile: str) -> str:
    entry = [json.loads(args) for op, args in instructions(dockerfile) if op == "ENTRYPOINT"]
    assert len(entry) == 1 and entry[0][1:2] == ["-m"], f"{dockerfile}: ENTRYPOINT {entry}"
    module: str = entry[0][2]
    return f"{module}.__main__" if tandem_file(f"{module}.__main__") else module


@pytest.mark.parametrize("dockerfile", [*sorted(IMAGES), "Dockerfile.operator"])
def test_image_provides_every_module_its_entry_point_imports(dockerfile: str) -> None:
    needed = third_party_imports(entry_module(dockerfile))
    have = provided(image_requirements(dockerfile))
    missing = {m: by for m, by in needed.items() if m not in have and m not in ABSENT_ON_PURPOSE.get(dockerfile, ())}
    assert not missing, (f"{dockerfile}: no requirement file it installs (nor their dependencies) provides "
                         + ", ".join(f"{m} (imported by {by})" for m, by in sorted(missing.items())))


def test_the_scan_sees_imports_in_function_bodies_and_skips_optional_ones() -> None:
    """The scan is what makes the test above worth anything: check it on two known modules."""
    choice = "tandem.checkpoint_engine.transport.transport_choice"
    select = tandem_file(choice)  # pyverbs: in a try/except ImportError
    assert select is not None and "pyverbs.device" not in imported(choice, select)
    # vLLM's SamplingParams, imported in a function body
    generation = tandem_file("tandem.sidecars.rollout_engine.generation")
    assert generation is not None and "vllm" in imported("tandem.sidecars.rollout_engine.generation", generation)
    assert "vllm" in third_party_imports("tandem.sidecars.rollout.__main__")
