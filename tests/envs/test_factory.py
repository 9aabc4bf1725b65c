"""What the rollout sidecar builds from `rollout.environment`: the user's tool functions, environment classes
and agent functions imported from `pythonPath`, each failure named by its field; the environment's own reward
reaching the trainer's `environment` reward."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from tandem.sidecars.envs.environments import ToolEnvironment
from tandem.sidecars.envs.factory import EnvironmentLoadError, agent_function, load_environment, make_environments
from tandem.sidecars.rewards.combine import RewardInput, RewardSet
from tandem.spec.environment import Environment
from tandem.spec.rewards import Reward

MODULE = '''
from typing import Any


def lookup(word: str) -> str:
    """Looks a word up.

    Args:
        word: the word
    """
    return word.upper()


def untyped(word):
    """No types."""
    return word


class Guess:
    def __init__(self, target: int) -> None:
        self.target = target
        self.stats = None

    def tools(self) -> list[dict[str, Any]]:
        return []

    def reset(self, row: dict[str, Any], messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return messages

    def step(self, reply: str) -> Any:
        return None


def agent(base_url: str, api_key: str, row: dict[str, Any], temperature: float = 1.0) -> float:
    return 0.0


def lazy_agent(base_url: str) -> None:
    return None
'''


@pytest.fixture()
def envs_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    name = f"user_envs_{tmp_path.name.replace('-', '_')}"  # a module name of its own per test
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(MODULE))
    monkeypatch.setattr("sys.path", list(__import__("sys").path))  # pythonPath entries vanish afterwards
    return name


def spec(**fields: Any) -> Environment:
    return Environment.model_validate(fields)


def test_the_users_tool_functions_join_the_built_in_ones(envs_dir: str, tmp_path: Path) -> None:
    env = make_environments(spec(type="tools", tools=["calculator", f"{envs_dir}:lookup"],
                                 pythonPath=[str(tmp_path)]))()
    assert isinstance(env, ToolEnvironment)
    assert [t["function"]["name"] for t in env.tools()] == ["calculator", "lookup"]
    step = env.step('<tool_call>{"name": "lookup", "arguments": {"word": "tandem"}}</tool_call>')
    assert step.messages == [{"role": "tool", "name": "lookup", "content": "TANDEM"}]
    with pytest.raises(EnvironmentLoadError, match=r"spec.rollout.environment.tools: .*untyped.* cannot be a tool"):
        make_environments(spec(type="tools", tools=[f"{envs_dir}:untyped"], pythonPath=[str(tmp_path)]))
    with pytest.raises(EnvironmentLoadError, match=r"spec.rollout.environment.tools\[1\]: cannot import 'nowhere'"):
        make_environments(spec(type="tools", tools=["calculator", "nowhere:tool"]))


def test_a_custom_environment_class_is_built_with_its_kwargs(envs_dir: str, tmp_path: Path) -> None:
    make = make_environments(spec(type="custom", entryPoint=f"{envs_dir}:Guess", kwargs={"target": 7},
                                  pythonPath=[str(tmp_path)]))
    first, second = make(), make()
    assert first is not second and first.target == 7  # type: ignore[attr-defined]
    with pytest.raises(EnvironmentLoadError, match=r"spec.rollout.environment.kwargs: .*Guess.*TypeError"):
        make_environments(spec(type="custom", entryPoint=f"{envs_dir}:Guess", kwargs={"aim": 7},
                               pythonPath=[str(tmp_path)]))
    with pytest.raises(EnvironmentLoadError, match=r"spec.rollout.environment.entryPoint: .*lookup is not a class"):
        make_environments(spec(type="custom", entryPoint=f"{envs_dir}:lookup", pythonPath=[str(tmp_path)]))
    with pytest.raises(EnvironmentLoadError, match=r"spec.rollout.environment.entryPoint: module .* has no 'Gone'"):
        make_environments(spec(type="custom", entryPoint=f"{envs_dir}:Gone", pythonPath=[str(tmp_path)]))


def test_an_agent_function_must_take_what_it_is_called_with(envs_dir: str, tmp_path: Path) -> None:
    ok = spec(type="agent", entryPoint=f"{envs_dir}:agent", kwargs={"temperature": 0.5}, pythonPath=[str(tmp_path)])
    assert load_environment(ok) is agent_function(ok) and agent_function(ok).__name__ == "agent"
    with pytest.raises(EnvironmentLoadError, match=r"takes no api_key, row, temperature"):
        agent_function(spec(type="agent", entryPoint=f"{envs_dir}:lazy_agent", kwargs={"temperature": 0.5},
                            pythonPath=[str(tmp_path)]))
    with pytest.raises(EnvironmentLoadError, match=r"Guess is not a function"):
        agent_function(spec(type="agent", entryPoint=f"{envs_dir}:Guess", pythonPath=[str(tmp_path)]))


def test_the_environment_reward_is_the_environments_own() -> None:
    rewards = RewardSet([Reward(type="environment", weight=2.0), Reward(type="answerMatch")])
    totals, parts = rewards.score([RewardInput("q", "42", "42", env_reward=0.25),
                                   RewardInput("q", "41", "42", env_reward=None)])
    assert parts["environment"] == [0.25, 0.0] and parts["answerMatch"] == [1.0, 0.0]
    assert totals == [1.5, 0.0]
