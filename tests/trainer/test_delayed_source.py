"""`sources.DelayedSource`, the diagnostic that gives the synchronous loop asynchronous k=1's staleness: each
iteration trains on the prompts of its own dataset batch, generated one version earlier, and generates the
next batch with the weights it holds. The rollouts here are a recorder of what was asked with which version
(the loop's ordering is under test, not vLLM)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from test_seeds import job

from tandem.sidecars.rollout_engine.sampling import Completion, SamplingOptions
from tandem.sidecars.trainer.loop.data.dataset import Prompt, PromptDataset
from tandem.sidecars.trainer.loop.rollout import sources


class Recorder:
    """Stands in for the rollout client: answers each prompt with its text, and records (text, version)."""

    def __init__(self) -> None:
        self.version = 0
        self.asked: list[tuple[str, int, int | None]] = []

    def generate(self, prompts: Sequence[str | list[int]], options: SamplingOptions,
                 n: int, *, expect: int | None = None) -> tuple[list[list[Completion]], set[int | None]]:
        out = []
        for i, p in enumerate(prompts):
            self.asked.append((str(p), self.version, options.seed))
            out.append([Completion(prompt_index=i, sample_index=j, prompt_token_ids=[1], token_ids=[2],
                                   logprobs=[-0.5], text=str(p)) for j in range(n)])
        return out, {self.version}


SPEC = {"seed": 3, "rollout": {"promptsPerIteration": 2}, "algorithm": {"groupSize": 2}}  # over test_seeds.job's


def test_each_batch_is_trained_one_version_after_it_was_generated(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(sources.DELAYED_ENV, "1")
    dataset = PromptDataset([Prompt(text=f"p{i}", answer=None, index=i) for i in range(12)], seed=3)
    rollouts = Recorder()
    source, _ = sources.make_source(job(tmp_path, **SPEC), dataset, rollouts, registry=None,  # type: ignore[arg-type]
                                    token="t", generation=0, version=0, first_iteration=0, resumed=None)
    assert isinstance(source, sources.DelayedSource)
    for it in range(4):
        rollouts.version = 10 + it  # the weights the loop holds in iteration `it`
        groups, stats = source.next(it, rollouts.version, SamplingOptions(seed=it))
        assert [g.prompt.text for g in groups] == [p.text for p in dataset.batch(it, 2)]  # its own prompts
        born = 10 if it == 0 else 10 + it - 1  # iterations 0 and 1 both train the starting weights' samples
        assert {g.born for g in groups} == {born} and stats["batch_version"] == born
        assert all(seg.version == born for g in groups for m in g.members for seg in m.segments)
    # what was generated: batches 0 and 1 with the first weights, then batch i + 1 with iteration i's
    generated = [(text, v) for text, v, _ in rollouts.asked]
    assert generated == [(p.text, 10 + max(0, b - 1)) for b in range(5) for p in dataset.batch(b, 2)]
    assert len({s for _, _, s in rollouts.asked}) == 5, "each batch's requests carry their own seed"


def test_without_the_variable_the_loop_is_synchronous(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(sources.DELAYED_ENV, raising=False)
    dataset = PromptDataset([Prompt(text=f"p{i}", answer=None, index=i) for i in range(12)], seed=3)
    source, _ = sources.make_source(job(tmp_path, **SPEC), dataset, Recorder(), registry=None,  # type: ignore[arg-type]
                                    token="t", generation=0, version=0, first_iteration=0, resumed=None)
    assert type(source) is sources.SyncSource
