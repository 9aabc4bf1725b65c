"""The trainer engine's rules on a job (`trainer.engine`), enforced offline by `tandem.spec.load.parse_job`
and by the real API server from the CRD's CEL rules, each naming the field; and what `auto` resolves to
(`tandem.spec.devices.trainer_engine`) for a model Megatron maps and for one it does not (config.json
read where the path is readable, as `tandem run` and the sidecars read it).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from rule_checks import Accepted, Rejected, model_dir, rule_tests
from wrappers import JobWrapper

from tandem.spec import devices
from tandem.spec.load import SpecError, parse_job

W = JobWrapper


def hf() -> JobWrapper:
    return W().set("trainer.engine", "hf")


REJECTED: Rejected = [
    ("hf-tensor-parallel", lambda: hf().set("trainer.tensorParallel", 2), "spec.trainer.engine",
     "data parallel only"),
    ("hf-pipeline-parallel", lambda: hf().set("trainer.pipelineParallel", 2), "spec.trainer.engine",
     "data parallel only"),
    ("hf-ppo-critic", lambda: hf().set("algorithm.name", "ppo").set("algorithm.advantage", "gae")
     .set("algorithm.critic", True), "spec.trainer.engine", "runs on the megatron engine"),
    ("unknown-engine", lambda: W().set("trainer.engine", "fsdp"), "spec.trainer.engine", ""),
    ("lora-on-megatron", lambda: W().set("trainer.engine", "megatron").set("trainer.lora", {"rank": 8}),
     "spec.trainer.lora", "LoRA trains on the hf engine"),
    ("lora-tensor-parallel", lambda: W().set("trainer.lora", {}).set("trainer.tensorParallel", 2)
     .set("gpusPerPod", 2), "spec.trainer.lora", "data parallel only"),
    ("lora-rank-0", lambda: W().set("trainer.lora", {"rank": 0}), "spec.trainer.lora.rank", ""),
    ("lora-no-targets", lambda: W().set("trainer.lora", {"targetModules": []}), "spec.trainer.lora.targetModules",
     ""),
    ("lora-adapter-rank-above-vllm", lambda: W().set("trainer.lora", {"rank": 1024}), "spec.trainer.lora.rank",
     "up to 512"),
    ("lora-adapter-sleep-level-2", lambda: W().set("trainer.lora", {}).set("rollout.betweenRollouts", "sleep")
     .set("rollout.sleepLevel", 2), "spec.rollout.sleepLevel", "drops the base weights"),
    ("lora-unknown-sync", lambda: W().set("trainer.lora", {"sync": "delta"}), "spec.trainer.lora.sync", ""),
]
ACCEPTED: Accepted = [
    ("hf", hf),
    ("hf-ppo-without-critic", lambda: hf().set("algorithm.name", "ppo").set("algorithm.critic", False)),
    ("lora-defaults", lambda: W().set("trainer.lora", {})),
    ("lora-hf", lambda: hf().set("trainer.lora", {"rank": 64, "alpha": 16, "targetModules": ["q_proj", "v_proj"],
                                                  "dropout": 0.05})),
    ("lora-merged-rank-1024", lambda: W().set("trainer.lora", {"rank": 1024, "sync": "merged"})),
    ("lora-merged-sleep-level-2", lambda: W().set("trainer.lora", {"sync": "merged"})
     .set("rollout.betweenRollouts", "sleep").set("rollout.sleepLevel", 2)),
    ("lora-adapter-sleep-level-1", lambda: W().set("trainer.lora", {}).set("rollout.betweenRollouts", "sleep")
     .set("rollout.sleepLevel", 1)),
    ("megatron-tp2", lambda: W().set("trainer.engine", "megatron").set("trainer.tensorParallel", 2)
     .set("gpusPerPod", 2)),
]

(test_offline_validation_names_the_field, test_offline_validation_accepts, test_api_server_rejects_naming_the_field,
 test_api_server_accepts) = rule_tests(REJECTED, ACCEPTED)


def test_auto_picks_megatron_where_a_mapping_exists_and_hf_elsewhere(tmp_path: Path) -> None:
    llama, gemma = model_dir(tmp_path, "llama"), model_dir(tmp_path, "gemma")
    assert devices.trainer_engine(parse_job(W().set("model.path", llama).obj(), "x").spec) == "megatron"
    assert devices.trainer_engine(parse_job(W().set("model.path", gemma).obj(), "x").spec) == "hf"
    assert devices.trainer_engine(parse_job(hf().set("model.path", llama).obj(), "x").spec) == "hf"
    with_lora = parse_job(W().set("model.path", llama).set("trainer.lora", {}).obj(), "x").spec
    assert devices.trainer_engine(with_lora) == "hf" and with_lora.trainer.lora is not None
    assert (with_lora.trainer.lora.rank, with_lora.trainer.lora.alpha) == (16, 32.0)
    assert with_lora.trainer.lora.sync == "adapter" and devices.adapter_sync(with_lora)
    sleeping = W().set("model.path", llama).set("rollout.betweenRollouts", "sleep")
    assert devices.sleep_level(with_lora) == 1 and devices.sleep_level(parse_job(sleeping.obj(), "x").spec) == 2
    merged = parse_job(W().set("model.path", llama).set("trainer.lora", {"sync": "merged"}).obj(), "x").spec
    assert not devices.adapter_sync(merged) and devices.sleep_level(merged) == 2
    # an unreadable path (it exists only in the pods): megatron, which names the model_type if it has no mapping
    assert devices.trainer_engine(parse_job(W().set("model.path", "/nowhere/m").obj(), "x").spec) == "megatron"
    with pytest.raises(SpecError) as err:
        parse_job(W().set("model.path", gemma).set("trainer.engine", "megatron").obj(), "x")
    assert "no weight mapping for model_type 'gemma'" in str(err.value) and "trainer.engine" in str(err.value)
    with pytest.raises(SpecError) as err:  # an explicit family must still match the file
        parse_job(W().set("model.path", gemma).set("model.family", "llama").obj(), "x")
    assert "does not match model_type 'gemma'" in str(err.value)


def test_ppo_critic_where_auto_picks_hf_is_refused_offline(tmp_path: Path) -> None:
    """Engine auto picks hf for a model megatron cannot map (config.json, readable here): no value head for
    PPO's critic. The CEL rules cannot read the file; LoRA, which also makes auto pick hf, both refuse."""
    gemma, llama = model_dir(tmp_path, "gemma"), model_dir(tmp_path, "llama")
    def ppo() -> JobWrapper:
        return W().set("algorithm.name", "ppo").set("algorithm.critic", True)

    with pytest.raises(SpecError) as err:
        parse_job(ppo().set("model.path", gemma).obj(), "x")
    assert "spec.algorithm.critic" in err.value.fields and "picks hf (no value head)" in str(err.value)
    assert parse_job(ppo().set("model.path", llama).obj(), "x").spec.algorithm.critic
    with pytest.raises(SpecError) as err:
        parse_job(ppo().set("trainer.lora", {}).obj(), "x")
    assert "spec.trainer.lora" in err.value.fields and "no value head" in str(err.value)
    assert "megatron" not in str(err.value).split("spec.trainer.lora:")[1].split("drop")[1]  # advice LoRA allows
