"""Routing replay's data path without engines: samples' routed experts through `pack` (plain rows, shared
prompts, micro-batch splits), the per-sample refusals naming the sample, and the rollout side's request-id
parsing and per-completion attachment (`tandem.sidecars.rollout_engine.routing`).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tandem.checkpoint_engine import errors
from tandem.sidecars.algorithms.algorithm_interface import Sample, pack_samples
from tandem.sidecars.algorithms.routed import RoutingError, bytes_per_sample
from tandem.sidecars.rollout_engine import routing
from tandem.sidecars.rollout_engine.sampling import Completion

LAYERS, TOPK = 2, 2


def routed(n: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(4, generator=gen)[:TOPK] for _ in range(n * LAYERS)]).reshape(
        n, LAYERS, TOPK).to(torch.uint8)


def group_samples() -> list[Sample]:
    prompt = [5, 6, 7, 8]
    out = []
    for k, c in enumerate(([9, 10, 11], [12], [13, 14])):
        out.append(Sample(prompt, c, group=0, routed_experts=routed(len(prompt) + len(c) - 1, k)))
    out.append(Sample([3, 4], [15, 16], group=1, routed_experts=routed(4, 9)))
    return out


@pytest.mark.parametrize("share", [False, True])
def test_each_token_keeps_its_routing_in_the_packed_rows(share: bool) -> None:
    samples = group_samples()
    batch = pack_samples(samples, 16, share_prompts=share)
    assert batch.routed_experts is not None and batch.routed_experts.dtype == torch.uint8
    assert batch.routed_experts.shape == (*batch.input_ids.shape, LAYERS, TOPK)
    for p in batch.placements:
        r = samples[p.sample].routed_experts
        assert r is not None
        own = batch.routed_experts[p.row, p.start:p.start + p.length - 1]  # its last token: never routed
        assert torch.equal(own, r[p.shared:p.shared + p.length - 1])
        if p.shared:  # the prefix holds the group's first sample's prompt rows
            first = samples[0].routed_experts
            assert first is not None
            assert torch.equal(batch.routed_experts[p.row, p.prefix_start:p.prefix_start + p.shared], first[:p.shared])
    padding = batch.segment_ids == 0
    assert (batch.routed_experts[padding] == torch.tensor([0, 1], dtype=torch.uint8)).all()
    parts = batch.split(2)
    assert torch.equal(torch.cat([m.routed_experts for m in parts if m.routed_experts is not None]),
                       batch.routed_experts)


def test_no_routing_packs_as_before_and_a_missing_or_misfit_one_is_refused() -> None:
    plain = [Sample(s.prompt_ids, s.completion_ids, s.group) for s in group_samples()]
    assert pack_samples(plain, 16).routed_experts is None
    samples = group_samples()
    samples[2].routed_experts = None
    with pytest.raises(RoutingError, match="sample 2 has no routed_experts"):
        pack_samples(samples, 16)
    samples = group_samples()
    samples[1].routed_experts = routed(2, 0)
    with pytest.raises(RoutingError, match="sample 1: routed_experts of shape"):
        pack_samples(samples, 16)
    samples = group_samples()
    samples[3].routed_experts = torch.zeros(4, LAYERS, 1, dtype=torch.uint8)
    with pytest.raises(RoutingError, match="sample 3: routed_experts has"):
        pack_samples(samples, 16)
    # rows: tokens - 1 each, but the last sample covers all its tokens (allowed); 4 bytes a row
    assert bytes_per_sample([s.routed_experts for s in group_samples()]) == (6 + 4 + 5 + 4) * 4 / 4


def test_request_ids_parse_back_to_request_and_sample() -> None:
    assert routing.key("7-1a2b3c4d") == ("7", 0)
    assert routing.key("3_7-1a2b3c4d") == ("7", 3)


def test_attach_sets_each_completions_routing_and_refuses_a_missing_record() -> None:
    rows = 4 * LAYERS * TOPK
    records = {("0", 0): (bytes(range(rows)), "uint8"), ("0", 1): (bytes(rows + 4), "uint8")}
    outs = [SimpleNamespace(request_id="0", outputs=[SimpleNamespace(index=0), SimpleNamespace(index=1)])]
    made = [[Completion(prompt_index=0, sample_index=k, prompt_token_ids=[1, 2, 3], token_ids=[4, 5], logprobs=[0, 0],
                        text="") for k in range(2)]]
    routing.attach(records, outs, made, LAYERS, TOPK)
    first = made[0][0].routed_experts
    assert first is not None and first.shape == (4, LAYERS, TOPK) and first.nbytes() == rows
    assert first.array().reshape(-1).tolist() == list(range(rows))
    assert made[0][1].routed_experts is not None and made[0][1].routed_experts.shape == (4, LAYERS, TOPK)
    again = Completion.model_validate_json(made[0][0].model_dump_json())  # the wire (rollout -> trainer)
    assert again.routed_experts is not None and (again.routed_experts.array() == first.array()).all()
    del records[("0", 1)]
    with pytest.raises(errors.CheckpointEngineError, match="no routed experts recorded for request 0 sample 1"):
        routing.attach(records, outs, made, LAYERS, TOPK)
    records[("0", 1)] = (bytes(rows - 4), "uint8")
    with pytest.raises(errors.CheckpointEngineError, match="recorded 3 of its 4 routed tokens"):
        routing.attach(records, outs, made, LAYERS, TOPK)


def test_the_drivers_samples_carry_the_rollouts_routing_through_partial_rollouts() -> None:
    """Whole completions and a completion continued over two segments (partial rollouts: the continuation's
    record covers the prompt and the first segment) become samples whose routing packs; an empty completion
    (stood in for by EOS) gets the filler row for its last prompt token."""
    from tandem.sidecars.rollout_engine.sampling import RoutedExperts
    from tandem.sidecars.trainer.loop.data.dataset import Prompt
    from tandem.sidecars.trainer.loop.rollout.partial import PartialRollouts, whole_groups
    from tandem.sidecars.trainer.loop.rollout.sources import to_samples

    def done(prompt: list[int], ids: list[int], reason: str = "stop") -> Completion:
        n = len(prompt) + len(ids) - 1
        return Completion(prompt_index=0, sample_index=0, prompt_token_ids=prompt, token_ids=ids,
                          logprobs=[-0.5] * len(ids), text="x", finish_reason=reason,
                          routed_experts=RoutedExperts.of(routed(n, n).numpy().tobytes(), (n, LAYERS, TOPK), "uint8"))

    prompt = Prompt("p", "1", 0, token_ids=[5, 6, 7])
    groups = whole_groups([prompt], [[done([5, 6, 7], [8, 9]), done([5, 6, 7], [])]], version=0)
    partial = PartialRollouts(token_budget=2, max_tokens=8, max_age=2, group_size=1)
    calls: list[list[int]] = []

    def generate(inputs: list[str | list[int]], limits: list[int]) -> tuple[list[Completion], int]:
        ids = list(inputs[0]) if not isinstance(inputs[0], str) else []
        calls.append(ids)
        first = len(calls) == 1
        return [done(ids, [10, 11] if first else [12], "length" if first else "stop")], 0

    groups += partial.step(generate, [prompt], 0).finished
    assert calls[1] == [5, 6, 7, 10, 11], "the continuation's prompt: the prompt and the first segment"
    samples, _ = to_samples(groups, eos_id=2, decode=lambda ids: "x")
    assert [len(s.completion_ids) for s in samples] == [2, 1, 3]
    empty = samples[1].routed_experts
    assert empty is not None and empty.shape[0] == 3 and (empty[-1] == torch.tensor([0, 1], dtype=torch.uint8)).all()
    continued = samples[2].routed_experts
    assert continued is not None and continued.shape == (3 + 3 - 1, LAYERS, TOPK)
    batch = pack_samples(samples, 16, share_prompts=True)
    assert batch.routed_experts is not None
