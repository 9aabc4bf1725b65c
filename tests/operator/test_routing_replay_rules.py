"""`algorithm.routingReplay` (MoE routing replay): its rules, enforced offline by `tandem.spec.load.parse_job` and
by the real API server from the CRD's CEL rules, each naming the field; what `auto` resolves to
(`tandem.spec.devices.routing_replay`) for a mixtral, a dense model, the hf engine, dpo and multi-turn jobs; and
the offline-only refusal of `on` for a config.json of a family no engine replays.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from rule_checks import Accepted, Rejected, model_dir, rule_tests
from wrappers import JobWrapper

from tandem.spec import devices
from tandem.spec.load import SpecError, parse_job

W = JobWrapper
FIELD = "spec.algorithm.routingReplay"


def on() -> JobWrapper:
    return W().set("algorithm.routingReplay", "on")


TOOLS = {"type": "tools", "tools": ["calculator"]}
REJECTED: Rejected = [
    ("on-hf", lambda: on().set("trainer.engine", "hf"), FIELD, "the hf engine"),
    ("on-lora", lambda: on().set("trainer.lora", {}), FIELD, "the hf engine"),
    ("on-dpo", lambda: on().set("algorithm.name", "dpo"), FIELD, "applies to grpo and ppo"),
    ("on-multi-turn", lambda: on().set("rollout.environment", TOOLS), FIELD, "multi-turn rollouts"),
    ("unknown-mode", lambda: W().set("algorithm.routingReplay", "always"), FIELD, ""),
]
ACCEPTED: Accepted = [
    ("on-megatron", lambda: on().set("trainer.engine", "megatron")),
    ("auto-hf", lambda: W().set("trainer.engine", "hf").set("algorithm.routingReplay", "auto")),
    ("off-dpo", lambda: W().set("algorithm.name", "dpo").set("algorithm.routingReplay", "off")),
    ("auto-multi-turn", lambda: W().set("rollout.environment", TOOLS)),
]

(test_offline_validation_names_the_field, test_offline_validation_accepts, test_api_server_rejects_naming_the_field,
 test_api_server_accepts) = rule_tests(REJECTED, ACCEPTED)


def test_auto_is_on_for_a_mixtral_on_megatron_and_off_elsewhere(tmp_path: Path) -> None:
    mixtral, qwen2 = model_dir(tmp_path, "mixtral"), model_dir(tmp_path, "qwen2")

    def resolved(w: JobWrapper) -> bool:
        return devices.routing_replay(parse_job(w.obj(), "x").spec)

    assert resolved(W().set("model.path", mixtral))
    assert resolved(W().set("model.path", mixtral).set("algorithm.name", "ppo"))
    assert not resolved(W().set("model.path", qwen2)), "a dense model: off"
    assert not resolved(W().set("model.path", "/nowhere/m")), "config.json unreadable here, family auto: off"
    assert resolved(W().set("model.path", "/nowhere/m").set("model.family", "mixtral"))
    assert not resolved(W().set("model.path", mixtral).set("trainer.engine", "hf"))
    assert not resolved(W().set("model.path", mixtral).set("algorithm.name", "dpo"))
    assert not resolved(W().set("model.path", mixtral).set("rollout.environment", TOOLS))
    assert not resolved(W().set("model.path", mixtral).set("algorithm.routingReplay", "off"))
    assert resolved(W().set("model.path", "/nowhere/m").set("algorithm.routingReplay", "on"))


def test_on_for_a_dense_config_is_refused_offline(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as err:
        parse_job(on().set("model.path", model_dir(tmp_path, "qwen2")).obj(), "x")
    assert FIELD in err.value.fields and "model_type 'qwen2'" in str(err.value) and "mixtral" in str(err.value)
