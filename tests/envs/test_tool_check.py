"""The user's tool modules checked before a job starts (`loader.tool_problems`, run by `tandem validate` and
`tandem run`): a missing module or function, a broken module and a function that cannot be a tool are each
refused naming `spec.rollout.environment.tools[i]` and the module; what this machine lacks (a pythonPath
volume, a package the image may have) is not judged by validate; `package.module.function` gets the fix."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from tandem.cli.main import app
from tandem.sidecars.envs.loader import tool_problems
from tandem.spec.environment import Environment

EXAMPLE = Path(__file__).parents[2] / "examples" / "smollm2-tools.yaml"
MODULE = '''
def lookup(word: str) -> str:
    """Looks a word up.

    Args:
        word: the word
    """
    return word.upper()


async def fetch(url: str) -> dict[str, str]:
    """Fetches a page.

    Args:
        url: the address
    """
    return {"url": url}


def spread(*words: str) -> str:
    """Joins words.

    Args:
        words: the words
    """
    return " ".join(words)


NOT_A_FUNCTION = 3
'''


@pytest.fixture()
def tools_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, str]]:
    """A pythonPath directory holding a tool module (a name of its own per test), one that raises on import
    and one that imports a package nobody has; sys.path and the modules imported restored afterwards."""
    name = f"user_tools_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(MODULE))
    (tmp_path / f"{name}_broken.py").write_text("raise RuntimeError('no database here')\n")
    (tmp_path / f"{name}_needs.py").write_text("import tandem_no_such_package  # noqa\n")
    monkeypatch.setattr("sys.path", list(sys.path))
    yield tmp_path, name
    for module in [m for m in sys.modules if m.startswith(name)]:
        del sys.modules[module]


def spec(tools: list[str], python_path: list[str]) -> Environment:
    return Environment.model_validate({"type": "tools", "tools": tools, "pythonPath": python_path})


def test_tools_that_load_pass(tools_dir: tuple[Path, str]) -> None:
    where, name = tools_dir
    ok = spec(["calculator", f"{name}:lookup", f"{name}:fetch", "python"], [str(where)])
    assert tool_problems(ok, missing_ok=False) == [] and tool_problems(ok, missing_ok=True) == []
    assert tool_problems(None, missing_ok=False) == []


@pytest.mark.parametrize(("tool", "says"), [
    ("nowhere_at_all:tool", "cannot import 'nowhere_at_all' (ModuleNotFoundError"),
    ("{name}:gone", "module '{name}' has no 'gone'"),
    ("{name}_broken:tool", "cannot import '{name}_broken' (RuntimeError: no database here)"),
    ("{name}:NOT_A_FUNCTION", "{name}:NOT_A_FUNCTION is a int, not a function"),
    ("{name}:spread", "'spread' cannot be a tool: *words cannot be sent by name"),
])
def test_a_tool_the_rollout_could_not_load_is_named(tools_dir: tuple[Path, str], tool: str, says: str) -> None:
    where, name = tools_dir
    problems = tool_problems(spec(["calculator", tool.format(name=name)], [str(where)]), missing_ok=True)
    assert len(problems) == 1 and problems[0][0] == "spec.rollout.environment.tools[1]", problems
    assert says.format(name=name) in problems[0][1], problems


def test_what_this_machine_lacks_is_judged_by_run_only(tools_dir: tuple[Path, str]) -> None:
    where, name = tools_dir
    on_a_volume = spec([f"{name}_elsewhere:tool"], [str(where), "/mnt/cluster-volume/tools"])
    assert tool_problems(on_a_volume, missing_ok=True) == []  # validate: it may be on the volume
    [(field, message)] = tool_problems(on_a_volume, missing_ok=False)  # run: this machine runs it
    assert field == "spec.rollout.environment.tools[0]" and "not here: /mnt/cluster-volume/tools" in message
    needs = spec([f"{name}_needs:tool"], [str(where)])
    assert tool_problems(needs, missing_ok=True) == []  # the image may install the package
    [(_, message)] = tool_problems(needs, missing_ok=False)
    assert "No module named 'tandem_no_such_package'" in message


def job_file(tmp_path: Path, environment: dict[str, Any]) -> Path:
    job = yaml.safe_load(EXAMPLE.read_text())
    job["spec"]["rollout"]["environment"] = environment
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def test_tandem_validate_imports_the_tool_modules(tools_dir: tuple[Path, str]) -> None:
    where, name = tools_dir
    runner = CliRunner()
    good = job_file(where, {"type": "tools", "tools": [f"{name}:lookup"], "pythonPath": [str(where)]})
    result = runner.invoke(app, ["validate", str(good)])
    assert result.exit_code == 0, result.output
    missing = job_file(where, {"type": "tools", "tools": ["calculator", f"{name}:gone", "not_a_module_x:tool"],
                               "pythonPath": [str(where)]})
    result = runner.invoke(app, ["validate", str(missing)])
    text = " ".join(result.output.split())  # rich may wrap the lines
    assert result.exit_code == 1 and f"spec.rollout.environment.tools[1]: module '{name}' has no 'gone'" in text
    assert "spec.rollout.environment.tools[2]: cannot import 'not_a_module_x'" in text, text
    dotted = job_file(where, {"type": "tools", "tools": [f"{name}.lookup"], "pythonPath": [str(where)]})
    result = runner.invoke(app, ["validate", str(dotted)])
    text = " ".join(result.output.split())
    assert result.exit_code == 1 and f"did you mean {name}:lookup?" in text, text
