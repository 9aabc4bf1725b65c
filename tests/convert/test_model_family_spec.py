"""`model.family` at validate time (tandem.spec): the spec's families are the converter's; a readable
config.json with a mismatching or missing model_type is refused naming the field, and one without a Megatron
mapping trains on the hf engine (refused only with `trainer.engine: megatron`).

What `tandem validate` prints comes from `tandem.spec.load.parse_job`'s SpecError (field, message).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, get_args

import pytest

from tandem.checkpoint_engine import convert
from tandem.spec.load import SpecError, parse_job
from tandem.spec.models import ModelRef


def _job(model: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "tandem.dev/v1alpha1",
        "kind": "RLHFJob",
        "metadata": {"name": "demo"},
        "spec": {
            "model": model,
            "rewards": [{"type": "answerMatch", "weight": 1.0}],
            "dataset": {"path": "/data/prompts.jsonl"},
        },
    }


def _model_dir(tmp_path: Path, config: Any) -> str:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


def _problems(model: dict[str, Any]) -> list[tuple[str, str]]:
    with pytest.raises(SpecError) as err:
        parse_job(_job(model))
    return err.value.problems


def test_spec_families_are_the_converters() -> None:
    literal = get_args(ModelRef.model_fields["family"].annotation)
    assert sorted(literal) == sorted(["auto", *convert.families()])
    assert sorted(ModelRef.FAMILIES) == convert.families()


def test_a_model_type_without_a_mapping_trains_on_the_hf_engine(tmp_path: Path) -> None:
    path = _model_dir(tmp_path, {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]})
    assert parse_job(_job({"path": path})).spec.trainer.engine == "auto"  # which resolves to hf (spec.devices)
    job = _job({"path": path})
    job["spec"]["trainer"] = {"engine": "megatron"}
    [(field, message)] = _problems_of(job)
    assert field == "spec.trainer.engine" and "megatron has no weight mapping for model_type 'gpt2'" in message
    assert "mapped: llama, mixtral, qwen2, qwen3" in message
    with pytest.raises(SpecError, match="spec.model.family"):  # an explicit family must match the file
        parse_job(_job({"path": path, "family": "llama"}))


def test_a_vision_language_model_trains_on_hf_and_what_it_cannot_do_is_refused(tmp_path: Path) -> None:
    path = _model_dir(tmp_path, {"model_type": "llava", "architectures": ["LlavaForConditionalGeneration"],
                                 "vision_config": {"model_type": "siglip_vision_model"},
                                 "text_config": {"model_type": "llama"}})
    assert parse_job(_job({"path": path})).spec.trainer.engine == "auto"  # which resolves to hf (spec.devices)
    cases = [({"trainer": {"engine": "megatron"}}, "spec.trainer.engine", "megatron does not train vision-language"),
             ({"algorithm": {"name": "dpo"}}, "spec.algorithm.name", "dpo packs its own pairs"),
             ({"rollout": {"partial": {"tokenBudget": 8}}, "algorithm": {"tisCap": 2.0}}, "spec.rollout.partial",
              "do not carry pictures"),
             ({"rollout": {"environment": {"type": "agent", "entryPoint": "agents:solve"}}},
              "spec.rollout.environment.type", "agent's OpenAI endpoint takes no pictures")]
    for change, want_field, want in cases:
        job = _job({"path": path})
        for key, value in change.items():
            job["spec"].setdefault(key, {}).update(value)
        [(field, message)] = _problems_of(job)
        assert field == want_field and want in message and "is a vision-language model (model_type 'llava')" \
            in message, (change, field, message)
    (tmp_path / "idefics").mkdir()
    other = _model_dir(tmp_path / "idefics", {"model_type": "idefics3", "vision_config": {"model_type": "idefics3"}})
    [(field, message)] = _problems_of(_job({"path": other}))
    assert field == "spec.model.path" and "not one the trainer prepares yet (trained: llava, qwen2_5_vl)" in message
    job = _job({"path": path})  # multi-turn: an environment (custom or tools) may answer with pictures
    job["spec"]["rollout"] = {"environment": {"type": "custom", "entryPoint": "envs:Look", "maxPictures": 2}}
    assert parse_job(job).spec.rollout.environment.max_pictures == 2  # type: ignore[union-attr]
    job = _job({"path": path})
    job["spec"]["trainer"] = {"freeze": ["visionTower", "projector"]}
    assert parse_job(job).spec.trainer.freeze == ["visionTower", "projector"]
    job = _job({"path": path})
    job["spec"]["trainer"] = {"lora": {"rank": 8}}  # adapters on its language model (trainer.engines.lora)
    assert parse_job(job).spec.trainer.lora is not None
    (tmp_path / "text").mkdir()
    text = _model_dir(tmp_path / "text", {"model_type": "llama", "architectures": ["LlamaForCausalLM"]})
    job = _job({"path": text})
    job["spec"]["trainer"] = {"freeze": ["projector"]}
    [(field, message)] = _problems_of(job)
    assert field == "spec.trainer.freeze" and "has no vision tower or projector" in message


def _problems_of(job: dict[str, Any]) -> list[tuple[str, str]]:
    with pytest.raises(SpecError) as err:
        parse_job(job)
    return err.value.problems


def test_config_without_model_type_is_refused(tmp_path: Path) -> None:
    [(field, message)] = _problems({"path": _model_dir(tmp_path, {"hidden_size": 8})})
    assert field == "spec.model.family" and "None" in message


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "qwen3", "mixtral"])
def test_supported_model_types_are_accepted(tmp_path: Path, model_type: str) -> None:
    path = _model_dir(tmp_path, {"model_type": model_type})
    assert parse_job(_job({"path": path})).spec.model.family == "auto"
    assert parse_job(_job({"path": path, "family": model_type})).spec.model.family == model_type


def test_explicit_family_must_agree_with_config(tmp_path: Path) -> None:
    path = _model_dir(tmp_path, {"model_type": "qwen3"})
    [(field, message)] = _problems({"path": path, "family": "qwen2"})
    assert field == "spec.model.family"
    assert "'qwen2' does not match model_type 'qwen3'" in message


def test_unreadable_config_is_accepted(tmp_path: Path) -> None:
    # a cluster path that does not exist here, a directory without config.json, a relative path
    for path in ("/models/not-here", str(tmp_path), "toy/model"):
        assert parse_job(_job({"path": path, "family": "qwen3"})).spec.model.path == path


def test_unparsable_config_is_refused_naming_path(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{not json")
    [(field, message)] = _problems({"path": str(tmp_path)})
    assert field == "spec.model.path" and "not valid JSON" in message
    (tmp_path / "config.json").write_text("[1, 2]")
    [(field, message)] = _problems({"path": str(tmp_path)})
    assert field == "spec.model.path" and "not a JSON object" in message


def test_unknown_family_name_is_refused() -> None:
    [(field, message)] = _problems({"path": "/models/x", "family": "gpt2"})
    assert field == "spec.model.family" and "qwen3" in message
