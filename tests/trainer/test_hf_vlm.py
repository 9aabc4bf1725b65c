"""A vision-language model on the hf trainer engine: the dataset's pictures become the rows' pixel values, and the
engine's log-probs of packed rows equal transformers' own forward of each sample alone.

Real parts: the VLM demo's builder (tests/rollout_engine/tiny_model.py's Qwen2 as the language model, a SigLIP
tower, LLaVA's projector), its picture split (shapes.py) read by the trainer's dataset, transformers' processor to
expand each prompt's image placeholder as vLLM reports it. Asserted: log-probs equal transformers' (with the image
token's logit pushed down by IMAGE_TOKEN_BIAS, as the rollout samples: never) within 1e-5 with
several samples of different pictures in one row, packed whole and with shared prompts; two prompts whose ids are
equal but whose pictures differ are not shared; a micro-batch whose pictures do not match its image tokens is
refused naming both counts; a GRPO step trains the tower, the projector and the language model together, or
leaves the parts trainer.freeze names as they were (and out of the optimizer).
"""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tandem.sidecars.algorithms.algorithm_interface import Sample, pack_samples, prompt_groups, row_budget
from tandem.sidecars.algorithms.grpo import GRPO
from tandem.sidecars.trainer.engines.common import EngineError
from tandem.sidecars.trainer.engines.heads import shift_to_labels
from tandem.sidecars.trainer.engines.hf_engine import HFEngine
from tandem.sidecars.trainer.loop.data.dataset import PromptDataset
from tandem.sidecars.vlm_demo import build, shapes
from tandem.spec.data import Dataset
from tandem.spec.trainer import IMAGE_TOKEN_BIAS

sys.path.insert(0, str(Path(__file__).parents[1] / "rollout_engine"))
import tiny_model  # noqa: E402


@pytest.fixture(scope="module")
def vlm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model.save_vlm(tmp_path_factory.mktemp("hf-vlm"))


def samples_of(vlm: Path, tmp_path: Path, rows: int = 3, per_prompt: int = 2) -> list[Sample]:
    """`per_prompt` random completions of each of the split's first `rows` prompts, with their prompt ids expanded
    by the processor (as vLLM reports them) and their pictures' pixel values."""
    from transformers import AutoProcessor, AutoTokenizer

    split = shapes.write_split(tmp_path / "data", "train", rows, seed=1)
    data = PromptDataset.load(Dataset(path=str(split), prompt_field="messages", answer_field="answer",
                                      images={"maxPerPrompt": 1}), AutoTokenizer.from_pretrained(vlm))
    processor = AutoProcessor.from_pretrained(vlm)
    rng = random.Random(0)
    out = []
    for g, prompt in enumerate(data.prompts):
        assert len(prompt.images) == 1 and prompt.token_ids is not None
        inputs = processor(images=list(prompt.images), text=prompt.text, return_tensors="pt")
        pixels = tuple(processor.image_processor(images=list(prompt.images), return_tensors="pt")["pixel_values"])
        assert torch.equal(pixels[0], inputs["pixel_values"][0])
        for _ in range(per_prompt):
            completion = [rng.randrange(10, 200) for _ in range(rng.randrange(3, 9))]
            out.append(Sample(prompt_ids=inputs["input_ids"][0].tolist(), completion_ids=completion, group=g,
                              reward=rng.random(), images=pixels))
    return out


def transformers_logprobs(vlm: Path, samples: list[Sample]) -> list[torch.Tensor]:
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(vlm, dtype=torch.float32).eval()
    out = []
    for s in samples:
        seq = torch.tensor([s.prompt_ids + s.completion_ids])
        with torch.no_grad():
            logits = model(input_ids=seq, pixel_values=torch.stack(s.images)).logits[0]
        out.append(completion_logprobs(logits, s, model.config.image_token_id))
    return out


def completion_logprobs(logits: torch.Tensor, s: Sample, image_id: int) -> torch.Tensor:
    """log p of each of `s`'s completion tokens from one forward's `logits` over prompt + completion, the image
    token pushed down as the rollout samples it (never)."""
    logits = logits.float()
    logits[:, image_id] += IMAGE_TOKEN_BIAS
    logp = torch.log_softmax(logits, dim=-1)
    n = len(s.prompt_ids)
    return logp[torch.arange(n - 1, n - 1 + len(s.completion_ids)), torch.tensor(s.completion_ids)]


def test_packed_rows_with_pictures_give_transformers_logprobs(vlm: Path, tmp_path: Path) -> None:
    samples = samples_of(vlm, tmp_path)
    want = transformers_logprobs(vlm, samples)
    engine = HFEngine.from_hf(vlm, trainable=False)
    for share in (False, True):
        batch = pack_samples(samples, 2 * row_budget(samples, share_prompts=share), share_prompts=share)
        assert batch.images is not None and batch.num_rows < len(samples)  # rows hold several pictures
        held = sum(len(row) for row in batch.images)
        assert held == (len(samples) // 2 if share else len(samples))  # a shared prompt's picture counts once
        got = batch.unpack(shift_to_labels(engine.token_logprobs(batch, micro_batch_size=1)))
        for i in range(len(samples)):
            assert (got[i] - want[i]).abs().max().item() < 1e-5, (share, i)


def test_equal_ids_with_other_pictures_are_not_one_prompt(vlm: Path, tmp_path: Path) -> None:
    a, b = samples_of(vlm, tmp_path, rows=2, per_prompt=1)
    b.prompt_ids = list(a.prompt_ids)  # the same text; only the picture differs
    assert prompt_groups([a, b]) == [[0], [1]]
    assert prompt_groups([a, Sample(list(a.prompt_ids), [5], 0, images=a.images)]) == [[0, 1]]


def test_pictures_that_do_not_match_the_image_tokens_are_refused(vlm: Path, tmp_path: Path) -> None:
    samples = samples_of(vlm, tmp_path, rows=1, per_prompt=1)
    batch = pack_samples(samples, row_budget(samples))
    assert batch.images is not None
    batch.images[0] = batch.images[0] * 2
    engine = HFEngine.from_hf(vlm, trainable=False)
    with pytest.raises(EngineError, match=f"holds {build.IMAGE_TOKENS} image tokens for 2 pictures"):
        engine.token_logprobs(batch)


@pytest.mark.parametrize("frozen", [(), ("visionTower",), ("visionTower", "projector")])
def test_a_grpo_step_trains_what_is_not_frozen(frozen: tuple[str, ...], vlm: Path, tmp_path: Path) -> None:
    samples = samples_of(vlm, tmp_path)
    engine = HFEngine.from_hf(vlm, lr=1e-3, frozen=frozen)
    before = {k: v.detach().clone() for k, v in engine.model.state_dict().items()}
    algo = GRPO(kl_coef=0.0)
    batch = algo.prepare(samples, row_budget(samples))

    def loss(out: torch.Tensor, mb: Any) -> tuple[torch.Tensor, dict[str, float]]:
        return algo.loss(shift_to_labels(out), mb)

    metrics = engine.train_step(batch, loss, micro_batch_size=2)
    assert metrics["update_ok"] == 1.0 and metrics["grad_norm"] > 0
    after = engine.model.state_dict()
    moved = {k.split(".")[1] for k, v in after.items() if k.startswith("model.") and not torch.equal(v, before[k])}
    parts = {"visionTower": "vision_tower", "projector": "multi_modal_projector"}
    assert moved == {"vision_tower", "multi_modal_projector", "language_model"} - {parts[f] for f in frozen}
    held = {p for group in engine.optimizer.param_groups for p in group["params"]} if engine.optimizer else set()
    assert all(not name.startswith(tuple(f"model.{parts[f]}." for f in frozen))
               for name, p in engine.model.named_parameters() if p in held)  # no optimizer state for them


def test_lora_on_a_vlm_adapts_its_language_model_only(vlm: Path, tmp_path: Path) -> None:
    """trainer.lora on a VLM: adapters on every linear layer of the language model and none in the tower or the
    projector (whose q_proj, fc1 ... PEFT's all-linear would adapt too, and vLLM would not serve); a GRPO step moves
    the adapters alone; versions carry them under PEFT's names, or merged under the model's own names; a target
    name the language model lacks (the tower's fc1) is refused naming trainer.lora.targetModules."""
    from tandem.sidecars.trainer.engines import lora
    from tandem.sidecars.trainer.engines.hf_engine import LANGUAGE_MODEL
    from tandem.spec.trainer import Lora

    engine = HFEngine.from_hf(vlm, lr=1e-2, lora=Lora(rank=4, alpha=8))
    adapters = [n for n, _ in engine.model.named_parameters() if lora.is_adapter(n)]
    tower_linears = [n for n, m in engine.model.named_modules()
                     if isinstance(m, torch.nn.Linear) and ".vision_tower." in n]
    assert tower_linears, "the tower has linear layers PEFT's all-linear would take"
    assert adapters and all(f".{LANGUAGE_MODEL}." in n for n in adapters), adapters
    adapted = {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in adapters}
    assert {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"} <= adapted
    before = {k: v.detach().clone() for k, v in engine.model.state_dict().items()}
    samples = samples_of(vlm, tmp_path)
    algo = GRPO(kl_coef=0.0)

    def loss(out: torch.Tensor, mb: Any) -> tuple[torch.Tensor, dict[str, float]]:
        return algo.loss(shift_to_labels(out), mb)

    for _ in range(2):  # B starts at zero: A moves in the first step, both in the second
        assert engine.train_step(algo.prepare(samples, row_budget(samples)), loss, micro_batch_size=2)["update_ok"]
    moved = {k for k, v in engine.model.state_dict().items() if not torch.equal(v, before[k])}
    assert moved and all(lora.is_adapter(k) for k in moved), sorted(moved)[:5]
    saved = dict(engine.export_adapters())
    assert set(saved) == {lora.saved_name(n) for n in adapters}
    assert engine.adapter_config()["r"] == 4
    from transformers import LlavaForConditionalGeneration

    names = LlavaForConditionalGeneration.from_pretrained(vlm).state_dict()  # merged: the VLM's own names
    assert sorted(n for n, _ in engine.export_hf()) == sorted(names)
    with pytest.raises(EngineError, match="trainer.lora.targetModules: \\['fc1'\\] name no linear layer"):
        HFEngine.from_hf(vlm, lora=Lora(rank=4, target_modules=["fc1"]))
