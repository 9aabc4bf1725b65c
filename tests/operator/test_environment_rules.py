"""`rollout.environment` (multi-turn rollouts: tools, custom environments, agents): its rules, enforced
offline by `parse_job` and by the real API server from the CRD's CEL rules, each naming the field; and the
environments and limits the rollout sidecar builds from it (`tandem.sidecars.envs.factory`)."""

from __future__ import annotations

import pytest
from rule_checks import Accepted, Rejected, rule_tests
from wrappers import JobWrapper

from tandem.sidecars.envs.environments import SingleTurn, ToolEnvironment
from tandem.sidecars.envs.factory import limits, make_environments
from tandem.spec.load import SpecError, parse_job

W = JobWrapper
TOOLS = {"type": "tools", "tools": ["calculator"]}
CUSTOM = {"type": "custom", "entryPoint": "envs.mine:Guess", "pythonPath": ["/data/envs"]}

REJECTED: Rejected = [
    ("tools-without-tools", lambda: W().set("rollout.environment", {"type": "tools"}),
     "spec.rollout.environment.tools", "at least one tool"),
    ("tools-on-single", lambda: W().set("rollout.environment", {"tools": ["calculator"]}),
     "spec.rollout.environment.tools", "type tools only"),
    ("tools-with-partial", lambda: W().set("rollout.environment", TOOLS)
     .set("rollout.partial", {"tokenBudget": 64}).set("algorithm.tisCap", 2.0),
     "spec.rollout.environment", "no rollout.partial"),
    ("tools-dynamic-sampling", lambda: W().set("rollout.environment", TOOLS)
     .set("algorithm.dynamicSampling", {"maxRounds": 2}), "spec.algorithm.dynamicSampling", "multi-turn rollouts"),
    ("zero-turns", lambda: W().set("rollout.environment", {**TOOLS, "maxTurns": 0}),
     "spec.rollout.environment.maxTurns", ""),
    ("custom-without-entry-point", lambda: W().set("rollout.environment", {"type": "custom"}),
     "spec.rollout.environment.entryPoint", "need an entryPoint"),
    ("entry-point-on-tools", lambda: W().set("rollout.environment", {**TOOLS, "entryPoint": "envs.mine:Env"}),
     "spec.rollout.environment.entryPoint", "custom and agent only"),
    ("entry-point-not-a-path", lambda: W().set("rollout.environment", {"type": "agent", "entryPoint": "agent.py"}),
     "spec.rollout.environment.entryPoint", ""),
    ("environment-reward-with-tools", lambda: W().set("rollout.environment", TOOLS)
     .set("rewards", [{"type": "environment"}]), "spec.rewards", "custom or agent"),
]
ACCEPTED: Accepted = [
    ("tools", lambda: W().set("rollout.environment", {**TOOLS, "maxTurns": 3, "maxTotalTokens": 384,
                                                      "maxToolOutputTokens": 32, "toolCallFormat": "llama3"})),
    ("single", lambda: W().set("rollout.environment", {"type": "single"})),
    ("tools-async", lambda: W().set("rollout.environment", TOOLS).set("algorithm.maxStaleness", 1)
     .set("algorithm.tisCap", 2.0)),
    ("custom-with-its-reward", lambda: W().set("rollout.environment", {**CUSTOM, "kwargs": {
        "target": 3, "nested": {"words": ["a", "b"], "on": True}}}).set("rewards", [
        {"type": "environment"}, {"type": "answerMatch", "weight": 0.5}])),
    ("agent", lambda: W().set("rollout.environment", {"type": "agent", "entryPoint": "agents.math:run",
                                                      "pythonPath": ["/data/agents"], "maxTurns": 8,
                                                      "trajectoryTimeoutSeconds": 120})),
    ("own-tools", lambda: W().set("rollout.environment", {"type": "tools", "tools": [
        "calculator", "python", "mytools.search:lookup"]})),
]


(test_offline_validation_names_the_field, test_offline_validation_accepts, test_api_server_rejects_naming_the_field,
 test_api_server_accepts) = rule_tests(REJECTED, ACCEPTED)


def test_an_unknown_tool_is_refused_naming_it() -> None:
    with pytest.raises(SpecError, match=r"spec.rollout.environment.tools.0: 'shell' is not a tool: calculator, python"):
        parse_job(W().set("rollout.environment", {"type": "tools", "tools": ["shell"]}).obj(), "x")
    dotted = {"type": "tools", "tools": ["python", "my_tools.web.search"]}  # a dot for the colon: the fix is named
    with pytest.raises(SpecError, match=r"tools.1: 'my_tools.web.search' .*did you mean my_tools.web:search\?"):
        parse_job(W().set("rollout.environment", dotted).obj(), "x")
    with pytest.raises(SpecError, match=r"spec.rollout.environment.pythonPath.0: String should match pattern '\^/'"):
        parse_job(W().set("rollout.environment", {**CUSTOM, "pythonPath": ["envs"]}).obj(), "x")


def test_the_sidecar_builds_the_environment_and_limits_the_spec_asks_for() -> None:
    spec = parse_job(ACCEPTED[0][1]().set("rollout.maxTokens", 48).obj(), "x").spec
    env = spec.rollout.environment
    make = make_environments(env)
    first, second = make(), make()
    assert isinstance(first, ToolEnvironment) and first is not second and first.box is second.box
    assert first.style == "llama3" and first.max_turns == 3
    assert [t["function"]["name"] for t in first.tools()] == ["calculator"]
    got = limits(env, spec.rollout.max_tokens)
    assert (got.max_turns, got.max_turn_tokens, got.max_total_tokens, got.max_tool_output_tokens) == (3, 48, 384, 32)
    assert isinstance(make_environments(None)(), SingleTurn) and limits(None, 48).max_turns == 1
