"""The hf trainer engine (transformers + FSDP2) against transformers itself and against the Megatron engine.

Real parts only: transformers' own forward is the reference for log-probs on packed rows, shared prompts
and scored-only forwards, for a tied and an untied Megatron family (qwen2, llama) and for Gemma, which
Megatron has no mapping for; a GRPO train step gives the Megatron engine's loss, gradient norm and
weights; two gloo ranks (FSDP2 sharding each weight in halves, the rows shared 2:1) give one rank's step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from dist_worker import assert_same_after_adam
from tiny_models import grouped_samples, make_family_dirs, make_tiny_hf_model

from tandem.sidecars.algorithms.algorithm_interface import Sample, pack_samples, row_budget
from tandem.sidecars.algorithms.grpo import GRPO
from tandem.sidecars.trainer.engines.common import EngineError
from tandem.sidecars.trainer.engines.heads import shift_to_labels
from tandem.sidecars.trainer.engines.hf_engine import HFEngine

FAMILIES = ["qwen2", "llama", "gemma"]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_family_dirs(tmp_path_factory.mktemp("tiny-hf-engine"), FAMILIES)


def _transformers_logprobs(model_dir: Path, samples: list[Sample]) -> list[torch.Tensor]:
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = []
    for s in samples:
        seq = torch.tensor([s.prompt_ids + s.completion_ids])
        with torch.no_grad():
            logp = torch.log_softmax(hf(seq).logits[0], dim=-1)
        n_p = len(s.prompt_ids)
        out.append(logp[torch.arange(n_p - 1, seq.shape[1] - 1), seq[0, n_p:]])
    return out


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("plain_head", [True, False], ids=["chunked-head", "model-logits"])
def test_packed_and_shared_rows_give_transformers_logprobs(family: str, plain_head: bool,
                                                           model_dirs: dict[str, Path]) -> None:
    samples = grouped_samples(1)
    want = _transformers_logprobs(model_dirs[family], samples)
    engine = HFEngine.from_hf(model_dirs[family])
    assert engine.plain_head  # none of these models scales or caps its logits
    engine.plain_head = plain_head  # False: the path of models whose head is not a plain linear map
    for share in (False, True):
        batch = pack_samples(samples, row_budget(samples, share_prompts=share), share_prompts=share)
        assert batch.num_rows < len(samples)  # several samples share a row
        for scored in (False, True):
            got = batch.unpack(shift_to_labels(engine.token_logprobs(batch, micro_batch_size=2, scored_only=scored)))
            for i in range(len(samples)):
                assert (got[i] - want[i]).abs().max().item() < 1e-5, (share, scored, i)


def _grpo_step(engine: Any, samples: list[Sample]) -> dict[str, float]:
    algo = GRPO(kl_coef=0.0, tis_cap=2.0, share_prompts=True)
    batch = algo.prepare(samples, row_budget(samples, share_prompts=True))

    def loss(out: torch.Tensor, mb: Any) -> tuple[torch.Tensor, dict[str, float]]:
        return algo.loss(shift_to_labels(out), mb)

    return dict(engine.train_step(batch, loss, micro_batch_size=2, reduction="sum"))


@pytest.mark.megatron
@pytest.mark.parametrize("family", ["qwen2", "llama"])  # qwen2 is tied: the head's gradient reaches the embedding
def test_grpo_step_equals_the_megatron_engines(family: str, model_dirs: dict[str, Path]) -> None:
    from tandem.sidecars.trainer.engines.megatron_engine import MegatronEngine

    samples = grouped_samples(2)
    megatron = MegatronEngine.from_hf(model_dirs[family], lr=1e-2, seed=0)
    want = _grpo_step(megatron, samples)
    want_after = {n: t.clone() for n, t in megatron.export_hf()}
    hf = HFEngine.from_hf(model_dirs[family], lr=1e-2, seed=0)
    before = {n: t.clone() for n, t in hf.export_hf()}
    got = _grpo_step(hf, samples)
    for key in ("loss", "pg_loss", "grad_norm", "update_ok"):
        assert got[key] == pytest.approx(want[key], rel=1e-4, abs=1e-6), key
    after = {n: t.clone() for n, t in hf.export_hf()}
    assert sorted(after) == sorted(want_after)  # the same HF names: a tied head left out by both
    moved = 0
    for name, tensor in want_after.items():
        assert_same_after_adam(after[name], tensor, name, steps=1, noisy=0.01)
        moved += int((after[name] - before[name]).abs().max() > 1e-3)
    assert moved == len(after)  # the step changed every tensor (the comparison is not of two unchanged models)


def test_weights_load_and_export_by_hf_name(model_dirs: dict[str, Path], tmp_path: Path) -> None:
    from safetensors.torch import load_file

    engine = HFEngine.from_hf(model_dirs["gemma"])
    file = load_file(str(model_dirs["gemma"] / "model.safetensors"))
    exported = {n: t.clone() for n, t in engine.export_hf()}
    assert sorted(exported) == sorted(file)  # the model's own names, the tied head left out as HF saves it
    assert all(torch.equal(exported[n], file[n]) for n in file)
    # another model's weights (same shape) swapped in by name, then a directory written and read back
    other = make_family_dirs(tmp_path / "other", ["gemma"])["gemma"]
    (other / "model.safetensors").rename(other / "w.safetensors")
    seeded = {n: t + 0.5 for n, t in load_file(str(other / "w.safetensors")).items()}
    assert engine.load_hf_weights(seeded.__getitem__) == len(file)
    saved = engine.save_hf(tmp_path / "saved", model_dirs["gemma"])
    back = load_file(str(saved / "model.safetensors"))
    assert all(torch.equal(back[n], seeded[n]) for n in seeded)
    with pytest.raises(EngineError, match="model.embed_tokens.weight: not in the weights"):
        engine.load_hf_weights({}.__getitem__)
    with pytest.raises(EngineError, match="no value head"):
        HFEngine.from_hf(model_dirs["gemma"], value_head=True)


def test_two_fsdp_ranks_equal_one(model_dirs: dict[str, Path], tmp_path: Path) -> None:
    import hf_worker
    import torch.multiprocessing as mp

    from tandem.checkpoint_engine.etcd.local_etcd import free_port

    model = str(model_dirs["llama"])
    mp.start_processes(hf_worker.run, args=(2, free_port(), str(tmp_path), model), nprocs=2, start_method="spawn")
    seen = [torch.load(tmp_path / f"hf-rank{r}.pt", weights_only=False) for r in range(2)]
    one = hf_worker.script(model)
    assert sorted(s["rows"] for s in seen) == [1, 2]  # shared unevenly: one rank ran a filler micro-batch
    for s in seen:
        assert (s["logprobs"] - one["logprobs"]).abs().max().item() < 1e-5
        assert s["train"]["loss"] == pytest.approx(one["train"]["loss"], rel=1e-5)
        assert s["train"]["grad_norm"] == pytest.approx(one["train"]["grad_norm"], rel=1e-4)
    assert seen[1]["export_after"] == {}  # only rank 0 exports
    after = seen[0]["export_after"]
    assert sorted(after) == sorted(one["export_after"])
    for name, tensor in one["export_after"].items():
        assert_same_after_adam(after[name], tensor, name, steps=1, noisy=0.01)


def test_reference_weights_swap_in_and_out_between_steps(model_dirs: dict[str, Path], tmp_path: Path) -> None:
    """The loop's order on FSDP2: train step, reference forward (its weights swapped in by name, then the
    policy's back), train step, policy forward. A forward without backward leaves the root module (embedding,
    final norm, head) unsharded, a backward reshards it: weights written by name must reach the shards
    whichever state the root is in, or the policy's embedding silently becomes the reference's. lr 0: the
    steps change nothing, so every forward has an exact answer."""
    from tandem.sidecars.trainer.loop.forwards.reference import ReferenceWeights

    samples = grouped_samples(3)
    other = make_tiny_hf_model(tmp_path / "other", family="gemma", seed=1)  # the same shape, other weights
    policy_want = _transformers_logprobs(model_dirs["gemma"], samples)
    ref_want = _transformers_logprobs(other, samples)
    engine = HFEngine.from_hf(model_dirs["gemma"], lr=0.0)
    batch = pack_samples(samples, row_budget(samples, share_prompts=True), share_prompts=True)
    reference = ReferenceWeights.capture(engine, str(other))

    def check(got: torch.Tensor, want: list[torch.Tensor]) -> None:
        unpacked = batch.unpack(shift_to_labels(got))
        for i in range(len(samples)):
            assert (unpacked[i] - want[i]).abs().max().item() < 1e-5, i

    for _ in range(2):
        _grpo_step(engine, samples)
        check(reference.token_logprobs(batch, scored_only=True), ref_want)
        check(engine.token_logprobs(batch, scored_only=True), policy_want)
    _grpo_step(engine, samples)
    check(engine.token_logprobs(batch), policy_want)
    exported = dict(engine.export_hf())
    assert engine.load_hf_weights(exported.__getitem__) == len(exported)  # after a forward, as resume loads
    check(engine.token_logprobs(batch), policy_want)
