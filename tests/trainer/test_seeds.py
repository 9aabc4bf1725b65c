"""`spec.seed` and the seeds derived from it (`tandem.spec.seeds`, `rollout_engine.prompt_seeds`, the rollout
entry's EngineConfig): repeats of a job with other seeds draw other prompts orders and samples, pods and
prompts never share a random stream, and seed 0 keeps the seeds a job had before the field existed."""

from __future__ import annotations

from pathlib import Path

import pytest

from tandem.sidecars.rollout.__main__ import engine_config
from tandem.sidecars.rollout_engine.sampling import prompt_seeds, slice_seed
from tandem.sidecars.trainer.loop.data.dataset import Prompt, PromptDataset
from tandem.spec import seeds
from tandem.spec.models import JobSpec
from tandem.spec.podenv import PodEnv


def job(tmp_path: Path, **extra: object) -> JobSpec:
    (tmp_path / "m").mkdir(exist_ok=True)
    (tmp_path / "m" / "config.json").write_text('{"max_position_embeddings": 2048}')
    s = JobSpec.model_validate({"model": {"path": "m"}, "dataset": {"path": "d.jsonl"}, "gpusPerPod": 0,
                                "rewards": [{"type": "answerMatch"}], **extra})
    return s.model_copy(update={"model": s.model.model_copy(update={"path": str(tmp_path / "m")})})


def env(tmp_path: Path, index: int, rollout_only: bool) -> PodEnv:
    return PodEnv.model_validate(PodEnv.environ(
        job="j", role="rollout", pod=f"j-{index}", pod_index=index, rollout_only=rollout_only,
        job_file=tmp_path / "job.yaml", etcd_endpoints="127.0.0.1:2379", port=8700, shm_dir=tmp_path))


def test_every_pod_of_a_job_gets_its_own_engine_seed(tmp_path: Path) -> None:
    pods = [(i, ro) for i in range(4) for ro in (False, True)]
    for seed in (0, 1, 7):
        got = [engine_config(env(tmp_path, i, ro), job(tmp_path, seed=seed)).seed for i, ro in pods]
        assert len(set(got)) == len(pods), got
    assert engine_config(env(tmp_path, 0, False), job(tmp_path)).seed == 0  # the default job: as before
    assert engine_config(env(tmp_path, 0, False), job(tmp_path, seed=1)).seed != 0


def test_request_seeds_differ_between_job_seeds_and_keep_seed_0() -> None:
    assert [seeds.request_seed(0, i) for i in range(5)] == list(range(5))
    got = {seeds.request_seed(s, i) for s in range(10) for i in range(1000)}
    assert len(got) == 10 * 1000 and all(0 <= x < 2**31 for x in got)


def test_prompt_seeds_give_every_sample_of_a_batch_its_own_stream() -> None:
    """vLLM seeds sample j of a prompt seeded s with s + j: no two samples of any prompt of ten consecutive
    requests (64 prompts x 16 samples each) may share a seed."""
    streams = [s + j for r in range(10) for s in prompt_seeds(r, 64) for j in range(16)]
    assert len(set(streams)) == len(streams)
    assert prompt_seeds(3, 5) == prompt_seeds(3, 5)  # reproducible


def test_the_job_seed_orders_the_prompts() -> None:
    prompts = [Prompt(text=f"p{i}", answer=None, index=i) for i in range(40)]
    order = [[p.index for p in PromptDataset(prompts, seed=s).batch(0, 40)] for s in (0, 0, 1)]
    assert order[0] == order[1] and order[0] != order[2] and sorted(order[2]) == list(range(40))


@pytest.mark.parametrize("bad", [-1, 2**31, "x"])
def test_a_bad_seed_names_the_field(tmp_path: Path, bad: object) -> None:
    with pytest.raises(ValueError, match="seed"):
        job(tmp_path, seed=bad)


def test_each_rollouts_slice_of_a_request_gets_its_own_seed() -> None:
    """The client spreads a request's prompts over the rollouts in slices, and each rollout seeds its
    prompts from the seed it gets: the slices' seeds must differ, or every rollout's first prompt would
    draw the same random numbers."""
    assert slice_seed(11, 0) == 11
    slices = [slice_seed(11, a) for a in range(0, 64, 8)]
    assert len(set(slices)) == len(slices)
    streams = [s + j for a in slices for s in prompt_seeds(a, 8) for j in range(16)]
    assert len(set(streams)) == len(streams)
