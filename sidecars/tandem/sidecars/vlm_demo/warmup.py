"""The VLM demo's supervised warm-up: the vision tower and projector learn to feed the frozen language model.

Role: a freshly built LLaVA (build.py) has a random tower, so the language model sees noise where the
picture is. `warm_up(model_dir, steps, ...)` trains the tower and the projector (the language model frozen, as
LLaVA's first stage does) on pictures of shapes.py, the answer one capitalised word and a full stop ("Red.")
after the chat template's assistant turn, the loss on the answer's tokens only; every `check_every` steps it
measures greedy accuracy on `eval_size` held-out pictures (a generator seed of its own) and stops at the first
check that reaches `target` or after `steps`: RL then starts from a model that is sometimes right and has room
to learn. The directory is saved again in place (build.save: the layout both transformers and vLLM load).
Returns the accuracy curve. Callers: `tandem models build` (pretrained.py), tests.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tandem.sidecars.vlm_demo import build, shapes

WARMUP_SEED = 10_000  # the warm-up's pictures: a generator seed neither the train nor the test split uses
EVAL_SEED = 20_000


@dataclass
class WarmUp:
    steps: int = 0
    seconds: float = 0.0
    accuracy: list[tuple[int, float]] = field(default_factory=list)  # (step, greedy accuracy on held-out)


def messages(question: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]


def target_text(answer: str) -> str:
    return answer.capitalize() + "."


def accuracy(model: Any, processor: Any, pictures: list[shapes.Picture], batch: int = 16) -> float:
    """Greedy accuracy: the generated text, stripped of its full stop and case, equals the answer."""
    right = 0
    tok = processor.tokenizer
    tok.padding_side = "left"
    for i in range(0, len(pictures), batch):
        chunk = pictures[i:i + batch]
        texts = [processor.apply_chat_template(messages(p.question), add_generation_prompt=True) for p in chunk]
        inputs = processor(images=[p.image for p in chunk], text=texts, return_tensors="pt", padding=True)
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=4, do_sample=False, pad_token_id=tok.pad_token_id)
        for p, ids in zip(chunk, out[:, inputs["input_ids"].shape[1]:], strict=True):
            said = tok.decode(ids, skip_special_tokens=True).strip().rstrip(".").lower()
            right += said == p.answer
    return right / max(1, len(pictures))


def warm_up(model_dir: Path, steps: int = 300, batch: int = 16, lr: float = 1e-3, check_every: int = 25,
            eval_size: int = 64, target: float = 0.5, seed: int = 0,
            progress: Callable[[str], None] | None = None) -> WarmUp:
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    torch.manual_seed(seed)
    processor = AutoProcessor.from_pretrained(model_dir)
    model = LlavaForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32)
    for p in model.model.language_model.parameters():
        p.requires_grad_(False)
    model.lm_head.requires_grad_(False)
    trained = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=lr, weight_decay=0.0)
    rng = random.Random(WARMUP_SEED + seed)
    held_out = [shapes.render(random.Random(EVAL_SEED + i)) for i in range(eval_size)]
    result = WarmUp()
    t0 = time.perf_counter()

    def check(step: int) -> bool:
        model.eval()
        acc = accuracy(model, processor, held_out)
        model.train()
        result.accuracy.append((step, acc))
        if progress is not None:
            progress(f"warm-up step {step}: held-out greedy accuracy {acc:.3f} ({time.perf_counter() - t0:.0f}s)")
        return acc >= target

    if not check(0):
        model.train()
        for step in range(1, steps + 1):
            loss = sft_loss(model, processor, [shapes.render(rng) for _ in range(batch)])
            loss.backward()
            torch.nn.utils.clip_grad_norm_(trained, 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            result.steps = step
            if step % check_every == 0 and check(step):
                break
    result.seconds = time.perf_counter() - t0
    model.eval()
    build.save(model, model_dir)
    return result


def sft_loss(model: Any, processor: Any, pictures: list[shapes.Picture]) -> torch.Tensor:
    """Cross-entropy of the answers ("Red.<|im_end|>") after each prompt, prompts and pads masked out."""
    tok = processor.tokenizer
    tok.padding_side = "right"
    prompts = [processor.apply_chat_template(messages(p.question), add_generation_prompt=True) for p in pictures]
    full = [t + target_text(p.answer) + "<|im_end|>" for t, p in zip(prompts, pictures, strict=True)]
    inputs = processor(images=[p.image for p in pictures], text=full, return_tensors="pt", padding=True)
    prompt_lens = [len(ids) for ids in processor(images=[p.image for p in pictures], text=prompts)["input_ids"]]
    labels = inputs["input_ids"].clone()
    labels[inputs["attention_mask"] == 0] = -100
    for row, n in enumerate(prompt_lens):
        labels[row, :n] = -100
    return model(**inputs, labels=labels).loss  # type: ignore[no-any-return]


BUILD = {"steps": 80, "check_every": 10, "target": 0.35, "eval_size": 64}  # `tandem models fetch llava-smollm2`:
# 20 steps of 16 pictures gave 0.28 held-out greedy accuracy (chance 1/6) at ~30 s a step on two loaded cores


def build_and_warm(lm_dir: Path, out: Path, seed: int = 0, progress: Callable[[str], None] | None = None,
                   **kwargs: Any) -> WarmUp:
    """build.build_llava, then warm_up (BUILD's settings unless given), into `out`."""
    build.build_llava(lm_dir, out, seed=seed)
    return warm_up(out, seed=seed, progress=progress, **{**BUILD, **kwargs})
