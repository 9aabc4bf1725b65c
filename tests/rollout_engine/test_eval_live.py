"""Held-out evaluation on the session's real vLLM engine: pass@1 of greedy samples against references
taken from the engine's own greedy output (right for some prompts, wrong for the others)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from tandem.checkpoint_engine.service.engine_status import Phase
from tandem.sidecars.rollout_engine.engine import RolloutEngine
from tandem.sidecars.rollout_engine.sampling import Completion, SamplingOptions
from tandem.sidecars.trainer.loop.data.dataset import Prompt
from tandem.sidecars.trainer.loop.held_out import Evaluator
from tandem.spec.data import Dataset, Eval
from tandem.spec.rewards import Reward

pytestmark = [pytest.mark.vllm, pytest.mark.etcd]

TEXTS = ["alpha beta gamma", "one two three four", "delta epsilon zeta", "seven eight nine ten",
         "sigma tau upsilon", "pi rho 13"]
WRONG = "no such answer qwerty"  # not made of the tokenizer's words: greedy text never equals it
MAX_TOKENS = 6


class EngineGenerator:
    """The evaluator's Generator over a local RolloutEngine (the driver's is the rollout client)."""

    def __init__(self, engine: RolloutEngine) -> None:
        self.engine = engine
        self.groups: list[list[list[Completion]]] = []

    def generate(self, prompts: Sequence[str] | Sequence[list[int]], options: SamplingOptions,
                 n: int) -> tuple[list[list[Completion]], set[int | None]]:
        groups = self.engine.generate(prompts, options, n)
        self.groups.append(groups)
        return groups, {self.engine.version}


def test_pass_at_1_on_the_live_engine(live_engine: RolloutEngine, tiny_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    ids = [tok(t).input_ids for t in TEXTS]
    spec = Eval(dataset=Dataset(path="/data/eval.jsonl"), samples=2, temperature=0.0, max_tokens=MAX_TOKENS,
                prompts=len(TEXTS), every=1)
    # the request the evaluator sends (same batch and options; greedy: one sample per prompt, as vLLM
    # refuses n > 1 at temperature 0): its answers
    probe = live_engine.generate(ids, SamplingOptions(temperature=0.0, top_p=1.0, max_tokens=MAX_TOKENS,
                                                      seed=spec.seed), n=1)
    greedy = [g[0].text for g in probe]
    answerable = [i for i, t in enumerate(greedy) if t.strip()]  # an EOS-first answer is empty: never "right"
    right = set(answerable[::2])
    assert right and len(right) < len(TEXTS), f"need right and wrong prompts; greedy texts: {greedy}"
    prompts = [Prompt(t, greedy[i] if i in right else WRONG, i, token_ids=ids[i]) for i, t in enumerate(TEXTS)]

    gen = EngineGenerator(live_engine)
    ev = Evaluator(spec, prompts, [Reward(type="answerMatch"), Reward(type="format", pattern="^never$")],
                   max_tokens=64, iterations=1)
    result = ev.run(gen, iteration=0, version=live_engine.version or 0)
    [groups] = gen.groups
    assert [[c.text for c in g] for g in groups] == [[c.text for c in g] for g in probe]
    assert [g[0].prompt_token_ids for g in groups] == ids  # the prompts' token ids went to vLLM
    assert all(len(c.token_ids) <= MAX_TOKENS for g in groups for c in g)
    assert result.prompts == len(TEXTS) and result.samples == 2
    assert result.pass_at_1 == pytest.approx(len(right) / len(TEXTS))
    assert result.pass_at_k == pytest.approx(len(right) / len(TEXTS))  # greedy samples agree: no gain from k
    assert live_engine.phase == Phase.READY


def test_sampled_pass_at_k_on_the_live_engine(live_engine: RolloutEngine) -> None:
    """temperature > 0: the k samples per prompt are drawn by vLLM (n = k, not one sample repeated)."""
    spec = Eval(dataset=Dataset(path="/data/eval.jsonl"), samples=3, temperature=2.0, max_tokens=MAX_TOKENS,
                prompts=2, seed=5)
    gen = EngineGenerator(live_engine)
    ev = Evaluator(spec, [Prompt(t, WRONG, i) for i, t in enumerate(TEXTS[:2])], [Reward(type="answerMatch")],
                   max_tokens=64, iterations=1)
    result = ev.run(gen, iteration=1, version=live_engine.version or 0)  # the version it serves
    [groups] = gen.groups
    assert [len(g) for g in groups] == [3, 3]
    assert any(len({c.text for c in g}) > 1 for g in groups), "sampled, not one greedy answer repeated"
    assert (result.pass_at_1, result.pass_at_k, result.samples) == (0.0, 0.0, 3)
