"""`trainer.expertParallel` and `trainer.distributedOptimizer` at validate time (tandem.spec.parallel).

Expert parallelism must divide the trainer's data-parallel size (Megatron refuses a world size that
tensor x expert x pipeline parallelism does not divide) and needs a mixture-of-experts model whose
expert count it divides; where config.json is readable here the count is checked. Each refusal names
`spec.trainer.expertParallel` (what `tandem validate` prints, from `parse_job`'s SpecError). The API
server's side of the same rules (CEL) is in tests/operator/test_operator_invalid.py's table.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tandem.spec.load import SpecError, parse_job
from tandem.spec.parallel import data_parallel_size

FIELD = "spec.trainer.expertParallel"


def _job(model: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "tandem.dev/v1alpha1",
        "kind": "RLHFJob",
        "metadata": {"name": "demo"},
        "spec": {"model": model, "rewards": [{"type": "answerMatch", "weight": 1.0}],
                 "dataset": {"path": "/data/prompts.jsonl"}, **spec},
    }


def _model_dir(directory: Path, config: dict[str, Any]) -> str:
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(config))
    return str(directory)


def _problems(doc: dict[str, Any]) -> list[tuple[str, str]]:
    with pytest.raises(SpecError) as err:
        parse_job(doc)
    return err.value.problems


@pytest.mark.parametrize(("replicas", "gpus", "tp", "pp", "dp"), [
    (1, 8, 1, 1, 8), (2, 8, 2, 2, 4), (3, 4, 4, 1, 3), (2, 0, 2, 2, 2), (1, 0, 1, 1, 1)])
def test_data_parallel_size(replicas: int, gpus: int, tp: int, pp: int, dp: int) -> None:
    """One rank per GPU (tp x pp per pod on CPU), over tp x pp."""
    assert data_parallel_size(replicas, gpus, tp, pp) == dp


@pytest.mark.parametrize(("spec", "ok"), [
    ({"gpusPerPod": 8, "trainer": {"tensorParallel": 2, "expertParallel": 4}}, True),  # dp 4
    ({"gpusPerPod": 8, "trainer": {"tensorParallel": 2, "expertParallel": 8}}, False),
    ({"gpusPerPod": 8, "trainer": {"pipelineParallel": 2, "expertParallel": 4}}, True),
    ({"gpusPerPod": 8, "trainer": {"expertParallel": 3}}, False),
    ({"gpusPerPod": 0, "replicas": 2, "trainer": {"tensorParallel": 2, "expertParallel": 2}}, True),  # dp 2
    ({"gpusPerPod": 0, "replicas": 1, "trainer": {"expertParallel": 2}}, False),
])
def test_expert_parallel_must_divide_the_data_parallel_size(spec: dict[str, Any], ok: bool) -> None:
    doc = _job({"path": "/models/not-here", "family": "mixtral"}, **spec)
    if ok:
        assert parse_job(doc).spec.trainer.expert_parallel == spec["trainer"]["expertParallel"]
        return
    [(field, message)] = _problems(doc)
    assert field == FIELD and "must divide the data-parallel size" in message


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_a_dense_family_refuses_expert_parallelism(family: str) -> None:
    [(field, message)] = _problems(_job({"path": "/models/not-here", "family": family},
                                        trainer={"expertParallel": 2}))
    assert field == FIELD and "mixture-of-experts" in message


def test_the_expert_count_of_a_readable_config_is_checked(tmp_path: Path) -> None:
    eight = _model_dir(tmp_path / "eight", {"model_type": "mixtral", "num_local_experts": 8})
    assert parse_job(_job({"path": eight}, trainer={"expertParallel": 8})).spec.trainer.expert_parallel == 8
    six = _model_dir(tmp_path / "six", {"model_type": "mixtral", "num_local_experts": 6})
    [(field, message)] = _problems(_job({"path": six}, trainer={"expertParallel": 4}))
    assert field == FIELD and "number of experts it divides" in message
    dense = _model_dir(tmp_path / "dense", {"model_type": "qwen2"})  # family auto, but no experts
    [(field, _)] = _problems(_job({"path": dense}, trainer={"expertParallel": 2}))
    assert field == FIELD
    assert parse_job(_job({"path": dense})).spec.trainer.expert_parallel == 1  # without EP it is fine


def test_an_unreadable_config_leaves_the_expert_count_to_the_trainer() -> None:
    """In a cluster the path exists only in the pods: family auto passes, the engine checks at start."""
    job = parse_job(_job({"path": "/models/not-here"}, trainer={"expertParallel": 2}))
    assert job.spec.trainer.expert_parallel == 2


def test_distributed_optimizer_is_on_by_default() -> None:
    assert parse_job(_job({"path": "/models/x"})).spec.trainer.distributed_optimizer is True
    off = parse_job(_job({"path": "/models/x"}, trainer={"distributedOptimizer": False}))
    assert off.spec.trainer.distributed_optimizer is False
