"""Qwen2.5-VL on the hf trainer engine: pictures as grids of patches, 3-D (mrope) positions per packed sample.

Real parts: a tiny Qwen2.5-VL built from a config (tests/rollout_engine/tiny_model.py's `save_qwen_vl`: random
weights, its processor), pictures of different sizes (so grids, and token counts, differ), transformers' processor
to expand each prompt's placeholder as vLLM reports it (tests/rollout_engine/test_qwen_vl_engine.py checks that
vLLM does). Asserted: the engine's log-probs of packed rows (several samples, one with two pictures, packed whole and
with shared prompts) equal transformers' forward of each sample alone (its own mrope positions from
`mm_token_type_ids`, the image token's logit pushed down as the rollout samples) within 1e-5; the pictures travel as
`[t, h, w, patch]` grids (`vision_inputs.as_pictures`) and the trainer's own preparation (`TrainerContext.pixels`)
gives them; a micro-batch whose pictures do not match its image tokens is refused naming the counts; a GRPO step
moves the tower, the merger (trainer.freeze's projector) and the language model, or leaves the frozen parts as
they were; LoRA adapts the language model alone (and merged versions keep the model's names); the spec takes
the family (hf engine, freeze, LoRA, shared prompts) and refuses what no vision-language model does yet
(megatron, dpo, partial rollouts) naming the field.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image, ImageDraw

from tandem.sidecars.algorithms.algorithm_interface import Sample, pack_samples, row_budget
from tandem.sidecars.algorithms.grpo import GRPO
from tandem.sidecars.trainer.engines.common import EngineError
from tandem.sidecars.trainer.engines.heads import shift_to_labels
from tandem.sidecars.trainer.engines.hf_engine import HFEngine
from tandem.sidecars.trainer.loop.context import TrainerContext
from tandem.spec.load import SpecError, parse_job

sys.path.insert(0, str(Path(__file__).parents[1] / "rollout_engine"))
import tiny_model  # noqa: E402
from test_hf_vlm import completion_logprobs  # noqa: E402

SIZES = ((100, 60), (64, 64), (60, 120))  # grids 4x8, 4x4, 8x4 patches: 8, 4, 8 image tokens


@pytest.fixture(scope="module")
def vlm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model.save_qwen_vl(tmp_path_factory.mktemp("qwen-vl") / "model")


def picture(seed: int, size: tuple[int, int]) -> Image.Image:
    rng = random.Random(seed)
    image = Image.new("RGB", size, tuple(rng.randrange(256) for _ in range(3)))  # type: ignore[arg-type]
    ImageDraw.Draw(image).ellipse([5, 5, size[0] // 2, size[1] // 2], fill=tuple(rng.randrange(256) for _ in range(3)))
    return image


def samples_of(vlm: Path, per_prompt: int = 2) -> list[Sample]:
    """`per_prompt` random completions of three prompts (the last with two pictures), their ids expanded by the
    processor as vLLM reports them, their pictures as the trainer prepares them."""
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(vlm)
    ctx = TrainerContext.__new__(TrainerContext)
    ctx.image_processor = processor.image_processor
    rng = random.Random(0)
    out = []
    for g, size in enumerate(SIZES):
        pics = [picture(g, size)] + ([picture(7, (56, 84))] if g == 2 else [])
        parts = [{"type": "image"} for _ in pics] + [{"type": "text", "text": f"alpha beta {g}"}]
        text = processor.tokenizer.apply_chat_template([{"role": "user", "content": parts}], tokenize=False,
                                                       add_generation_prompt=True)
        inputs = processor(images=pics, text=text, return_tensors="pt")
        grids = ctx.pixels(tuple(pics))
        assert [list(t.shape[:3]) for t in grids] == inputs["image_grid_thw"].tolist()
        assert torch.equal(torch.cat([t.reshape(-1, t.shape[-1]) for t in grids]), inputs["pixel_values"])
        for _ in range(per_prompt):
            completion = [rng.randrange(10, 700) for _ in range(rng.randrange(3, 9))]
            out.append(Sample(prompt_ids=inputs["input_ids"][0].tolist(), completion_ids=completion, group=g,
                              reward=rng.random(), images=grids))
    return out


def transformers_logprobs(vlm: Path, samples: list[Sample]) -> list[torch.Tensor]:
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(vlm, dtype=torch.float32).eval()
    image_id = model.config.image_token_id
    out = []
    for s in samples:
        seq = torch.tensor([s.prompt_ids + s.completion_ids])
        kinds = (seq == image_id).int()  # mm_token_type_ids: 1 on image tokens, as the processor gives them
        grids = torch.tensor([list(t.shape[:3]) for t in s.images])
        patches = torch.cat([t.reshape(-1, t.shape[-1]) for t in s.images])
        with torch.no_grad():
            logits = model(input_ids=seq, pixel_values=patches, image_grid_thw=grids,
                           mm_token_type_ids=kinds).logits[0]
        out.append(completion_logprobs(logits, s, image_id))
    return out


def test_packed_rows_with_picture_grids_give_transformers_logprobs(vlm: Path) -> None:
    samples = samples_of(vlm)
    want = transformers_logprobs(vlm, samples)
    engine = HFEngine.from_hf(vlm, trainable=False)
    worst = 0.0
    for share in (False, True):
        batch = pack_samples(samples, 3 * row_budget(samples, share_prompts=share), share_prompts=share)
        assert batch.images is not None and batch.num_rows < len(samples)  # rows hold several pictures
        held = sum(len(row) for row in batch.images)
        assert held == (4 if share else 8)  # a shared prompt's pictures count once
        got = batch.unpack(shift_to_labels(engine.token_logprobs(batch, micro_batch_size=1)))
        for i in range(len(samples)):
            worst = max(worst, (got[i] - want[i]).abs().max().item())
            assert (got[i] - want[i]).abs().max().item() < 1e-5, (share, i)
    print(f"\nhf engine (packed) vs transformers alone: largest log-prob gap {worst:.2e}")


def test_pictures_that_do_not_match_the_image_tokens_are_refused(vlm: Path) -> None:
    samples = samples_of(vlm, per_prompt=1)[:1]
    batch = pack_samples(samples, row_budget(samples))
    assert batch.images is not None
    batch.images[0] = batch.images[0] * 2
    engine = HFEngine.from_hf(vlm, trainable=False)
    with pytest.raises(EngineError, match="holds 8 image tokens for 2 pictures of 16 tokens in all"):
        engine.token_logprobs(batch)


@pytest.mark.parametrize("frozen", [(), ("visionTower",), ("projector",)])
def test_a_grpo_step_trains_what_is_not_frozen(frozen: tuple[str, ...], vlm: Path) -> None:
    samples = samples_of(vlm)
    engine = HFEngine.from_hf(vlm, lr=1e-3, frozen=frozen)
    before = {k: v.detach().clone() for k, v in engine.model.state_dict().items()}
    algo = GRPO(kl_coef=0.0)
    batch = algo.prepare(samples, row_budget(samples))

    def loss(out: torch.Tensor, mb: Any) -> tuple[torch.Tensor, dict[str, float]]:
        return algo.loss(shift_to_labels(out), mb)

    assert engine.train_step(batch, loss, micro_batch_size=2)["update_ok"] == 1.0
    after = engine.model.state_dict()

    def part(name: str) -> str:
        return "projector" if name.startswith("model.visual.merger.") else \
            "visionTower" if name.startswith("model.visual.") else "language"

    moved = {part(k) for k, v in after.items() if not torch.equal(v, before[k])}
    assert moved == {"visionTower", "projector", "language"} - set(frozen)


def test_the_spec_takes_qwen2_5_vl_on_the_hf_engine(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2_5_vl", "vision_config": {
        "model_type": "qwen2_5_vl"}, "architectures": ["Qwen2_5_VLForConditionalGeneration"]}))
    job = {"apiVersion": "tandem.dev/v1alpha1", "kind": "RLHFJob", "metadata": {"name": "demo"},
           "spec": {"model": {"path": str(tmp_path)}, "rewards": [{"type": "answerMatch", "weight": 1.0}],
                    "dataset": {"path": "/data/prompts.jsonl"},
                    "trainer": {"freeze": ["visionTower"], "lora": {"rank": 8}, "sharePrompts": True}}}
    spec = parse_job(job).spec
    assert spec.trainer.engine == "auto" and spec.trainer.freeze == ["visionTower"]
    refused = [({"trainer": {"engine": "megatron"}}, "spec.trainer.engine", "megatron does not train vision-language"),
               ({"algorithm": {"name": "dpo"}}, "spec.algorithm.name", "dpo packs its own pairs"),
               ({"rollout": {"partial": {"tokenBudget": 8}}, "algorithm": {"tisCap": 2.0}}, "spec.rollout.partial",
                "do not carry pictures")]
    for change, want_field, want in refused:
        job["spec"] = {k: v for k, v in job["spec"].items() if k in ("model", "rewards", "dataset")} | change
        with pytest.raises(SpecError) as err:
            parse_job(job)
        [(field, message)] = err.value.problems
        assert field == want_field and want in message and "(model_type 'qwen2_5_vl')" in message, (field, message)


def test_lora_on_qwen_vl_adapts_its_language_model_only(vlm: Path) -> None:
    """trainer.lora: adapters on every linear layer of the language model, none in the tower (its qkv, proj, mlp)
    or the merger; a GRPO step moves the adapters alone; merged versions carry the model's own names."""
    from tandem.sidecars.trainer.engines import lora
    from tandem.sidecars.trainer.engines.hf_engine import LANGUAGE_MODEL
    from tandem.spec.trainer import Lora

    engine = HFEngine.from_hf(vlm, lr=1e-2, lora=Lora(rank=4, alpha=8))
    adapters = [n for n, _ in engine.model.named_parameters() if lora.is_adapter(n)]
    assert adapters and all(f".{LANGUAGE_MODEL}." in n for n in adapters), adapters
    assert {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"} == \
        {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in adapters}
    before = {k: v.detach().clone() for k, v in engine.model.state_dict().items()}
    samples = samples_of(vlm)
    algo = GRPO(kl_coef=0.0)

    def loss(out: torch.Tensor, mb: Any) -> tuple[torch.Tensor, dict[str, float]]:
        return algo.loss(shift_to_labels(out), mb)

    for _ in range(2):  # B starts at zero: A moves in the first step, both in the second
        assert engine.train_step(algo.prepare(samples, row_budget(samples)), loss, micro_batch_size=2)["update_ok"]
    moved = {k for k, v in engine.model.state_dict().items() if not torch.equal(v, before[k])}
    assert moved and all(lora.is_adapter(k) for k in moved), sorted(moved)[:5]
    from transformers import AutoModelForImageTextToText

    names = AutoModelForImageTextToText.from_pretrained(vlm).state_dict()
    assert sorted(n for n, _ in engine.export_hf()) == sorted(names)
